"""The graph document's value encodings round trip, and every broken document is refused by field."""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from strategies.graph.graph_format import (
    DEFAULT_LIMITS,
    GraphExportError,
    GraphFormatError,
    GraphLimits,
    GraphTooLarge,
    ValueReader,
    encode_value,
)
from strategies.graph.imported import load_graph, read_graph
from tests.strategies.graph.graph_documents import exported_text

ARGUMENTS = [
    3,
    0,
    -(2**63),
    2**63 - 1,
    0.5,
    1.0,
    -0.0,
    1e-300,
    float("inf"),
    float("-inf"),
    True,
    False,
    None,
    "bsk,kn->bsn",
    "",
    [1, 2, 3],
    (1, 2),
    (),
    [],
    [(1, [2.0, None]), ("a",)],
    torch.float32,
    torch.bfloat16,
    torch.int64,
    torch.bool,
    torch.float8_e4m3fn,
    torch.device("cpu"),
    torch.device("meta"),
    torch.strided,
    torch.sparse_coo,
    torch.contiguous_format,
    torch.channels_last,
    torch.preserve_format,
]


def _no_node(value: Any) -> None:
    return None


def _typed(value: Any) -> Any:
    """A value with its types spelled out, so 1 == 1.0 == True and (1,) == [1] do not pass for equal."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_typed(v) for v in value])
    if isinstance(value, float):
        return ("float", repr(value))  # tells -0.0 from 0.0
    return (type(value).__name__, value)


@pytest.mark.parametrize("value", ARGUMENTS, ids=repr)
def test_every_argument_encoding_round_trips_through_json_text(value: Any) -> None:
    text = json.dumps(encode_value(value, _no_node, "x"), allow_nan=False)
    back = ValueReader(DEFAULT_LIMITS, resolve=None).read(json.loads(text), "x")
    assert _typed(back) == _typed(value)


def test_nan_round_trips_as_nan() -> None:
    encoded = encode_value(float("nan"), _no_node, "x")
    assert encoded == {"float": "nan"}
    assert math.isnan(ValueReader(DEFAULT_LIMITS, resolve=None).read(json.loads(json.dumps(encoded)), "x"))


def test_node_references_and_fake_tensors_round_trip() -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    encoded = encode_value([node, (node, 2)], lambda v: v.name if isinstance(v, torch.fx.Node) else None, "a")
    assert encoded == [{"node": "x"}, {"tuple": [{"node": "x"}, 2]}]
    back = ValueReader(DEFAULT_LIMITS, resolve=lambda name, where: {"x": node}[name]).read(encoded, "a")
    assert back == [node, (node, 2)]

    tensor = torch.empty(4, 6, dtype=torch.bfloat16).t()  # strides (1, 6): not contiguous
    encoded = encode_value((tensor, None, [tensor]), _no_node, "val")
    assert encoded["tuple"][0] == {"tensor": {"shape": [6, 4], "stride": [1, 6], "dtype": "bfloat16"}}
    fake, none, listed = ValueReader(DEFAULT_LIMITS, None, FakeTensorMode()).read(encoded, "val")
    assert isinstance(fake, FakeTensor) and none is None and isinstance(listed, list)
    assert (fake.shape, fake.stride(), fake.dtype) == (tensor.shape, tensor.stride(), tensor.dtype)


def test_a_value_the_format_lacks_is_refused_at_export_by_name() -> None:
    with pytest.raises(GraphExportError, match=r"^nodes\[mm\]\.args\[1\]: a complex value"):
        encode_value([1, 2j], _no_node, "nodes[mm].args")


# ------------------------------------------------------------------------------------------ rejections


def _document() -> dict[str, Any]:
    return json.loads(exported_text("mlp"))


def _index(document: dict[str, Any], name: str) -> int:
    return next(i for i, node in enumerate(document["nodes"]) if node["name"] == name)


def _first_op(document: dict[str, Any], op: str) -> int:
    return next(i for i, node in enumerate(document["nodes"]) if node["op"] == op)


def _set(path: str, value: Any, field: str | None = None) -> Callable[[dict[str, Any]], str]:
    """A breakage: set ``path`` (``nodes[<op or name>].field`` resolved on the document) to ``value``;
    returns the field the error must name: ``field`` (resolved the same way), else ``path``."""

    def breaks(document: dict[str, Any]) -> str:
        named = _resolved(document, field or path)  # before the change, which may change an op
        target, keys = _walk(document, path)
        if value is _DELETE:
            del target[keys]
        else:
            target[keys] = value
        return named

    return breaks


def _set_role(role: str, key: str, node: str) -> Callable[[dict[str, Any]], str]:
    """A breakage: ``document[role][key] = node`` (keys are dotted parameter names)."""

    def breaks(document: dict[str, Any]) -> str:
        document[role][key] = node
        return f"{role}.{key}"

    return breaks


_DELETE = object()


def _walk(document: dict[str, Any], path: str) -> tuple[Any, Any]:
    parts = _resolved(document, path).replace("[", ".[").split(".")
    target: Any = document
    for part in parts[:-1]:
        target = target[int(part[1:-1])] if part.startswith("[") else target[part]
    last = parts[-1]
    return target, int(last[1:-1]) if last.startswith("[") else last


def _resolved(document: dict[str, Any], path: str) -> str:
    """``nodes[aten.mm.default]`` -> ``nodes[7]`` (the first node of that op), ``nodes[t]`` by name."""
    if path.startswith("nodes[") and not path[6].isdigit():
        key, rest = path[6:].split("]", 1)
        index = _first_op(document, key) if "." in key else _index(document, key)
        return f"nodes[{index}]{rest}"
    return path


def _append_node(node: dict[str, Any], field: str = "args[1]") -> Callable[[dict[str, Any]], str]:
    """A breakage: a node appended to the document; the error names ``field`` of it."""

    def breaks(document: dict[str, Any]) -> str:
        document["nodes"].append(node)
        return f"nodes[{len(document['nodes']) - 1}].{field}"

    return breaks


def _forward_reference(document: dict[str, Any]) -> str:
    first = _first_op(document, "aten.t.default")
    later = document["nodes"][-1]["name"]
    document["nodes"][first]["args"][0] = {"node": later}
    return f"nodes[{first}].args[0].node"


def _self_reference(document: dict[str, Any]) -> str:
    first = _first_op(document, "aten.t.default")
    document["nodes"][first]["args"][0] = {"node": document["nodes"][first]["name"]}
    return f"nodes[{first}].args[0].node"


def _deep_argument(document: dict[str, Any]) -> str:
    """An argument nested one level deeper than the bound (``args`` itself is the first level)."""
    first = _first_op(document, "aten.mse_loss.default")
    value: Any = 1
    for _ in range(DEFAULT_LIMITS.max_depth):
        value = [value]
    args = document["nodes"][first]["args"]
    args.append(value)
    return f"nodes[{first}].args[{len(args) - 1}]" + "[0]" * (DEFAULT_LIMITS.max_depth - 1)


def _unroled_placeholder(document: dict[str, Any]) -> str:
    name = document["inputs"].pop()
    return f"nodes[{_index(document, name)}]"


SHAPE = "nodes[arg0_1].val.tensor.shape"

REJECTIONS: list[tuple[str, Callable[[dict[str, Any]], str], str]] = [
    ("wrong version", _set("version", 2), "version 2 is not supported"),
    ("version as text", _set("version", "1"), "expected an integer, got str"),
    ("wrong format", _set("format", "onnx"), "expected 'autoshard.graph'"),
    ("other passes", _set("passes", ["expose_sequence_dims"]), "expected"),
    ("unknown aten op", _set("nodes[aten.t.default].op", "aten.no_such_op.default"), "unknown op"),
    ("unknown overload", _set("nodes[aten.t.default].op", "aten.mm.Tensor"), "unknown op"),
    ("builtins.eval", _set("nodes[aten.t.default].op", "builtins.eval"), "not an allowed op"),
    ("a dunder lookup", _set("nodes[aten.t.default].op", "aten.__class__.__init__"), "not an allowed op"),
    ("not an op packet", _set("nodes[aten.t.default].op", "aten.name.upper"), "unknown op"),
    ("an op without a tensor", _set("nodes[aten.t.default].op", "aten._assert_scalar.default"),
     "returns no tensor"),
    ("unknown node", _set("nodes[aten.t.default].args[0].node", "x"), "unknown node 'x'"),
    ("forward reference", _forward_reference, "is defined later"),
    ("cycle", _self_reference, "is defined later"),
    ("too deep", _deep_argument, "nested deeper than 8 levels"),
    ("args not a list", _set("nodes[aten.t.default].args", "arg0_1"), "expected a list, got str"),
    ("negative size", _set(SHAPE, [-1, 4], f"{SHAPE}[0]"), "non-negative int64"),
    ("bool size", _set(SHAPE, [True, 4], f"{SHAPE}[0]"), "non-negative int64"),
    ("strides of another rank", _set("nodes[arg0_1].val.tensor.stride", [1]), "1 strides for 2 dims"),
    ("unknown dtype", _set("nodes[arg0_1].val.tensor.dtype", "float128"), "unknown dtype 'float128'"),
    ("unknown tag", _set("nodes[aten.mse_loss.default].args[2]", {"code": "1"}), "unknown tag 'code'"),
    ("two tags", _set("nodes[aten.mse_loss.default].args[2]", {"dtype": "float32", "x": 1}),
     "exactly one key"),
    ("bare infinity", _set("nodes[aten.mse_loss.default].args[2]", math.inf), 'written {"float": "inf"}'),
    ("cuda device", _set("nodes[aten.mse_loss.default].args[2]", {"device": "cuda"},
                         "nodes[aten.mse_loss.default].args[2].device"), "unknown device"),
    ("device as a string", _append_node(
        {"name": "ones", "op": "aten.ones.default", "args": [[2]], "kwargs": {"device": "cuda"}, "val": None}
    , "kwargs.device"), 'written {"device": "cpu"}'),
    ("tensor as argument", _set("nodes[aten.mse_loss.default].args[2]", {"tensor": {}}),
     "unknown tag 'tensor'"),
    ("node as output", _set("nodes[aten.t.default].val", {"node": "arg0_1"}), "unknown tag 'node'"),
    ("shapes that do not follow", _set("nodes[aten.t.default].val.tensor.shape", [4, 4],
                                       "nodes[aten.t.default].val"),
     "declares 4x4:bfloat16, the op gives 1024x4096:bfloat16"),
    ("an op refusing its arguments", _set("nodes[aten.addmm.default].args[2]", {"node": "arg0_2"},
                                          "nodes[aten.addmm.default]"), "fails on its arguments"),
    ("missing loss", _set("loss", _DELETE), "missing"),
    ("missing val", _set("nodes[aten.t.default].val", _DELETE), "missing"),
    ("missing op", _set("nodes[aten.t.default].op", _DELETE), "expected a string, got null"),
    ("unknown field", _set("nodes[aten.t.default].shape", [1]), "unknown field"),
    ("unknown top-level field", _set("code", "print(1)"), "unknown field"),
    ("model not a string", _set("model", ["mlp"]), "expected a string, got list"),
    ("producer not strings", _set("producer", {"torch": {"a": [1]}}, "producer.torch"),
     "expected a string, got dict"),
    ("duplicate name", _set("nodes[aten.t.default].name", "arg0_1"), "duplicate node name"),
    ("not an identifier", _set("nodes[aten.t.default].name", "t; rm"), "not an identifier"),
    ("a keyword as name", _set("nodes[aten.t.default].name", "class"), "not usable as a node name"),
    ("loss not scalar", _set("loss", "arg0_1"), "not a floating scalar"),
    ("gradient of another shape", _set_role("gradients", "w1.bias", "arg0_1"),
     "not a tensor of arg0_2's shape"),
    ("gradient of no parameter", _set_role("gradients", "nope", "arg0_1"), "not a parameter"),
    ("parameter not a placeholder", _set_role("parameters", "w1.bias", "addmm"), "not a tensor placeholder"),
    ("placeholder without a role", _unroled_placeholder, "has no role"),
    ("layers not held", _set("layers", {"captured": 4, "total": 32}, "layers.captured"),
     "graph's module paths hold 0 layers"),
    ("module path", _set("nodes[aten.t.default].module", "w1/../x"), "not a dotted name"),
    ("getitem out of range", _append_node(
        {"name": "gi", "op": "operator.getitem", "args": [{"node": "addmm"}, 0], "kwargs": {}, "val": None}
    ), "addmm has no output 0"),
]  # fmt: skip


@pytest.mark.parametrize(("breaks", "message"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_a_broken_document_is_refused_naming_the_field(breaks: Callable, message: str) -> None:
    document = _document()
    field = breaks(document)
    with pytest.raises(GraphFormatError) as refused:
        load_graph(copy.deepcopy(document))
    assert refused.value.field == field, str(refused.value)
    assert message in refused.value.message
    assert refused.value.status == (413 if isinstance(refused.value, GraphTooLarge) else 422)
    assert str(refused.value) == f"{field}: {refused.value.message}"


def test_the_unbroken_document_loads() -> None:
    assert load_graph(_document()).graph.loss.name == "mse_loss"


def test_an_op_named_from_another_module_is_refused_without_importing_it(monkeypatch) -> None:
    import builtins

    imported: list[str] = []
    real_import = builtins.__import__

    def watching(name: str, *args: Any, **kwargs: Any) -> Any:
        imported.append(name)
        return real_import(name, *args, **kwargs)

    load_graph(_document())  # the reader's own lazy imports, done once
    monkeypatch.setattr(builtins, "__import__", watching)
    for op in ("os.system", "antigravity.geohash.default", "subprocess.run.default", "aten.os.system"):
        document = _document()
        document["nodes"][_first_op(document, "aten.t.default")]["op"] = op
        with pytest.raises(GraphFormatError, match=r"not an allowed op|unknown op"):
            load_graph(document)
    assert not [name for name in imported if name.split(".")[0] in ("os", "antigravity", "subprocess")]
    assert "antigravity" not in sys.modules


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        (GraphLimits(max_nodes=10), "nodes"),
        (GraphLimits(max_string=4), "nodes[0].name"),
        (GraphLimits(max_rank=1), "nodes[0].val.tensor.shape"),
        (GraphLimits(max_numel=100), "nodes[0].val.tensor.shape"),
    ],
)
def test_a_document_past_a_bound_is_refused_as_too_large(limits: GraphLimits, field: str) -> None:
    with pytest.raises(GraphTooLarge) as refused:
        load_graph(_document(), limits)
    assert refused.value.field == field and refused.value.status == 413


def test_long_lists_are_refused_as_too_large() -> None:
    reader = ValueReader(GraphLimits(max_items=4), resolve=None)
    assert reader.read([1, 2, 3, 4], "x") == [1, 2, 3, 4]
    with pytest.raises(GraphTooLarge, match=r"^x\.tuple: more than 4 items"):
        reader.read({"tuple": [1, 2, 3, 4, 5]}, "x")


def test_the_text_is_bounded_before_it_is_parsed() -> None:
    text = exported_text("mlp")
    with pytest.raises(GraphTooLarge, match=r"^\(document\): longer than 100 bytes"):
        read_graph(text, GraphLimits(max_bytes=100))
    with pytest.raises(GraphFormatError, match=r"^\(document\): not JSON"):
        read_graph(text[:-1])
    with pytest.raises(GraphTooLarge, match="nested too deeply"):
        read_graph("[" * 200_000 + "]" * 200_000, GraphLimits(max_bytes=10**6))
    with pytest.raises(GraphFormatError, match=r"^\(document\): expected an object, got list"):
        read_graph("[]")
    assert read_graph(text.encode()) == json.loads(text)
