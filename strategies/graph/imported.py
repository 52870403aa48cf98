"""A graph document (``docs/graph-format.md``) back as the :class:`JointGraph` the planner plans from.

The reader never imports a module and never evaluates a name the document gives: an op name is split
into ``namespace.op.overload``, the namespace must be one of ``aten``, ``prims`` or ``autoshard`` (or the
name is ``operator.getitem``), and the name must resolve to a ``torch._ops.OpOverload`` that returns a
tensor. Every node's output value is rebuilt as a fake tensor (a ``FakeTensorMode``: no memory), and each
op is run once on the fake values of its arguments to check the output the document declares (shape and
dtype), so a document whose shapes do not follow from its ops is refused at the node that breaks.

Anything the reader refuses raises :class:`~strategies.graph.graph_format.GraphFormatError` with
``field``, a path into the document (``nodes[12].args[1]``); a document past one of the
:class:`~strategies.graph.graph_format.GraphLimits` raises its subclass ``GraphTooLarge``.
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.utils._pytree import tree_map

from strategies.graph.graph_format import (
    ALLOWED_NAMESPACES,
    DEFAULT_LIMITS,
    FORMAT,
    GETITEM,
    NAME,
    OP_PART,
    PASSES,
    QUALIFIED_NAME,
    VERSION,
    GraphFormatError,
    GraphLimits,
    GraphTooLarge,
    ValueReader,
    check_items,
    check_keys,
    check_string,
    expect,
)
from strategies.tensor_meta import flatten_outputs

if TYPE_CHECKING:
    from strategies.graph.capture import JointGraph
    from strategies.problem.layer_repeat import LayerRepeat

REQUIRED = ("format", "version", "passes", "nodes", "parameters", "buffers", "inputs", "loss", "gradients")
OPTIONAL = ("model", "producer", "tied", "constants", "input_gradients", "layers")


@dataclass
class ImportedGraph:
    """A graph document read back: the step, and what the document says about it."""

    graph: JointGraph
    repeat: LayerRepeat | None
    """The capture holds ``repeat.captured`` layers of a stack of ``repeat.total`` (``layers``)."""
    model: str
    """The document's label of the model (informative only)."""


def read_graph(text: str | bytes, limits: GraphLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The JSON text of a graph document as data, refused when longer than ``limits.max_bytes`` or nested
    beyond what the JSON parser takes. Use :func:`load_graph` on the result."""
    if len(text) > limits.max_bytes:
        raise GraphTooLarge("(document)", f"longer than {limits.max_bytes} bytes")
    try:
        document = json.loads(text)
    except RecursionError:
        raise GraphTooLarge("(document)", "nested too deeply to parse") from None
    except ValueError as error:
        raise GraphFormatError("(document)", f"not JSON: {error}") from None
    return expect(document, dict, "(document)")


def load_graph(document: Any, limits: GraphLimits = DEFAULT_LIMITS) -> ImportedGraph:
    """Validate a graph document (as parsed JSON) and rebuild its step; see the module docstring."""
    check_header(document)
    check_keys(document, "", REQUIRED, OPTIONAL)
    return _Reader(document, limits).read()


def check_header(document: Any) -> None:
    """Format and version first, so a newer document is refused for its version, not for a new field."""
    expect(document, dict, "(document)")
    if document.get("format") != FORMAT:
        raise GraphFormatError("format", f"expected {FORMAT!r}, got {str(document.get('format'))[:40]!r}")
    version = expect(document.get("version"), int, "version")
    if version != VERSION:
        raise GraphFormatError("version", f"version {version} is not supported; this reader knows {VERSION}")
    if document.get("passes") != list(PASSES):
        raise GraphFormatError("passes", f"expected {list(PASSES)} (the passes of version {VERSION})")


def resolve_op(name: str, where: str) -> Any:
    """The op a document names: ``operator.getitem`` or a tensor-returning overload of an allowed
    namespace. Nothing outside ``torch.ops`` is looked up; no module is imported."""
    if name == GETITEM:
        return operator.getitem
    parts = name.split(".")
    if len(parts) != 3 or parts[0] not in ALLOWED_NAMESPACES or not all(OP_PART.match(p) for p in parts):
        raise GraphFormatError(
            where,
            f"{name[:80]!r} is not an allowed op: only {GETITEM} and "
            f"{'/'.join(ALLOWED_NAMESPACES)}.<op>.<overload> names of torch.ops",
        )
    namespace, packet_name, overload = parts
    if namespace == "autoshard":
        import strategies.ops.einsum_ops  # noqa: F401  (registers torch.ops.autoshard)
    try:
        packet = getattr(getattr(torch.ops, namespace), packet_name)
        op = getattr(packet, overload) if isinstance(packet, torch._ops.OpOverloadPacket) else None
    except (AttributeError, RuntimeError):
        op = None
    if not isinstance(op, torch._ops.OpOverload):
        raise GraphFormatError(where, f"unknown op {name!r}")
    if not any("Tensor" in str(r.type) for r in op._schema.returns):
        raise GraphFormatError(where, f"{name} returns no tensor: not an op of a training step's graph")
    return op


class _Reader:
    def __init__(self, document: dict[str, Any], limits: GraphLimits) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.doc = document
        self.limits = limits
        self.graph = fx.Graph()
        self.nodes: dict[str, fx.Node] = {}
        self.names: set[str] = set()
        self.module_path: dict[str, str] = {}
        self.fake_mode = FakeTensorMode()
        self.args = ValueReader(limits, self._resolve)
        self.values = ValueReader(limits, None, self.fake_mode)

    def read(self) -> ImportedGraph:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module

        from strategies.graph.capture import JointGraph, _backward_start

        records = expect(self.doc["nodes"], list, "nodes")
        if len(records) > self.limits.max_nodes:
            raise GraphTooLarge("nodes", f"more than {self.limits.max_nodes} nodes")
        self.names = self._names(records)
        for i, record in enumerate(records):
            self._node(record, f"nodes[{i}]")
        roles = self._roles()
        outputs = [roles["loss"], *roles["gradients"].values(), *roles["input_gradients"].values()]
        self.graph.output(outputs)
        with _use_lazy_graph_module(True):
            gm = fx.GraphModule(torch.nn.Module(), self.graph)
        order = [n for n in self.graph.nodes if n.op == "call_function"]
        graph = JointGraph(
            gm=gm,
            order=order,
            backward_start=_backward_start(order, roles["loss"]),
            module_path=self.module_path,
            **roles,
        )
        self._producer()
        model = check_string(expect(self.doc.get("model", ""), str, "model"), "model", self.limits)
        return ImportedGraph(graph, self._layers(), model)

    def _producer(self) -> None:
        """``producer`` is informative (versions of what wrote the document): short strings only."""
        producer = expect(self.doc.get("producer", {}), dict, "producer")
        check_items(producer, "producer", self.limits)
        for key, value in producer.items():
            check_string(expect(value, str, f"producer.{key[:40]}"), f"producer.{key[:40]}", self.limits)

    # ------------------------------------------------------------------------------------------ nodes

    def _names(self, records: list[Any]) -> set[str]:
        names: set[str] = set()
        for i, record in enumerate(records):
            name = expect(expect(record, dict, f"nodes[{i}]").get("name"), str, f"nodes[{i}].name")
            if not NAME.match(check_string(name, f"nodes[{i}].name", self.limits)):
                raise GraphFormatError(f"nodes[{i}].name", f"{name!r} is not an identifier")
            if name in names:
                raise GraphFormatError(f"nodes[{i}].name", f"duplicate node name {name!r}")
            names.add(name)
        return names

    def _resolve(self, name: str, where: str) -> fx.Node:
        if name in self.nodes:
            return self.nodes[name]
        if name in self.names:
            raise GraphFormatError(
                where, f"node {name!r} is defined later: nodes must be in topological order (no cycles)"
            )
        raise GraphFormatError(where, f"unknown node {name[:80]!r}")

    def _node(self, record: dict[str, Any], where: str) -> None:
        name = record["name"]
        op_text = expect(record.get("op"), str, f"{where}.op")
        if op_text == "placeholder":
            check_keys(record, where, ("name", "op", "val"))
            node = self.graph.placeholder(name)
        else:
            check_keys(record, where, ("name", "op", "args", "kwargs", "val"), ("module",))
            target = resolve_op(check_string(op_text, f"{where}.op", self.limits), f"{where}.op")
            args = tuple(self.args.read(expect(record["args"], list, f"{where}.args"), f"{where}.args"))
            kwargs = self._kwargs(expect(record["kwargs"], dict, f"{where}.kwargs"), f"{where}.kwargs")
            _check_devices(target, args, kwargs, where)
            node = self.graph.create_node("call_function", target, args, kwargs, name=name)
            if "module" in record:
                self.module_path[name] = self._qualified(record["module"], f"{where}.module", empty=True)
        if node.name != name:
            raise GraphFormatError(f"{where}.name", f"{name!r} is not usable as a node name")
        node.meta["val"] = self.values.read(record["val"], f"{where}.val")
        if node.op == "call_function":
            self._check_output(node, where)
        self.nodes[name] = node

    def _kwargs(self, kwargs: dict[str, Any], where: str) -> dict[str, Any]:
        check_items(kwargs, where, self.limits)
        for key in kwargs:
            if not NAME.match(check_string(key, where, self.limits)):
                raise GraphFormatError(where, f"{key[:40]!r} is not a keyword name")
        return {key: self.args.read(value, f"{where}.{key}") for key, value in kwargs.items()}

    def _check_output(self, node: fx.Node, where: str) -> None:
        """Run the op on its arguments' fake values: its outputs must be the ones the document declares."""
        if node.target is operator.getitem:
            self._check_getitem(node, where)
            return
        values = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        try:
            with self.fake_mode, torch.no_grad():
                if node.target._schema.is_mutable:  # on copies: the op must not change other nodes' values
                    values = tree_map(_fresh, values)
                result = node.target(*values[0], **values[1])
        except Exception as error:  # the op refuses its arguments: name the node, not the op's internals
            first = (str(error).strip().splitlines() or [""])[0][:200]
            raise GraphFormatError(where, f"{node.target} fails on its arguments: {first}") from None
        declared, actual = flatten_outputs(node.meta["val"]), flatten_outputs(result)
        if declared != actual:
            shown = ", ".join(str(m) for m in actual)
            raise GraphFormatError(f"{where}.val", f"declares {_text(declared)}, the op gives {shown}")

    def _check_getitem(self, node: fx.Node, where: str) -> None:
        source, index = node.args if len(node.args) == 2 else (None, None)
        if (
            not isinstance(source, fx.Node)
            or isinstance(index, bool)
            or not isinstance(index, int)
            or node.kwargs
        ):
            raise GraphFormatError(f"{where}.args", "operator.getitem takes [{'node': name}, index]")
        values = source.meta["val"]
        if not isinstance(values, (tuple, list)) or not 0 <= index < len(values):
            raise GraphFormatError(f"{where}.args[1]", f"{source.name} has no output {index}")
        if flatten_outputs(values[index]) != flatten_outputs(node.meta["val"]):
            raise GraphFormatError(f"{where}.val", f"differs from output {index} of {source.name}")

    # ------------------------------------------------------------------------------------------ roles

    def _roles(self) -> dict[str, Any]:
        doc = self.doc
        parameters = self._placeholders(doc["parameters"], "parameters")
        buffers = self._placeholders(doc["buffers"], "buffers")
        inputs = [
            self._placeholder(n, f"inputs[{i}]") for i, n in enumerate(expect(doc["inputs"], list, "inputs"))
        ]
        roles = Counter([*parameters.values(), *buffers.values(), *inputs])
        for i, node in enumerate(self.nodes.values()):
            if node.op == "placeholder" and roles[node] != 1:
                had = "has no role" if roles[node] == 0 else f"has {roles[node]} roles"
                raise GraphFormatError(
                    f"nodes[{i}]", f"placeholder {node.name!r} {had}: one of parameter, buffer or input"
                )
        loss = self._resolve(expect(doc["loss"], str, "loss"), "loss")
        val = loss.meta["val"]
        if not isinstance(val, torch.Tensor) or val.ndim != 0 or not val.dtype.is_floating_point:
            raise GraphFormatError("loss", f"{loss.name} is not a floating scalar")
        gradients = self._gradients(parameters)
        input_gradients = self._input_gradients(inputs)
        constants = expect(doc.get("constants", []), list, "constants")
        for i, name in enumerate(constants):
            if name not in buffers:
                raise GraphFormatError(f"constants[{i}]", f"{str(name)[:80]!r} is not a buffer")
        return {
            "parameters": parameters,
            "tied": self._tied(parameters),
            "buffers": buffers,
            "inputs": inputs,
            "loss": loss,
            "gradients": gradients,
            "input_gradients": input_gradients,
        }

    def _placeholders(self, mapping: Any, field: str) -> dict[str, fx.Node]:
        check_items(expect(mapping, dict, field), field, self.limits)
        return {
            self._qualified(name, field): self._placeholder(node, f"{field}.{name}")
            for name, node in mapping.items()
        }

    def _placeholder(self, name: Any, where: str) -> fx.Node:
        node = self._resolve(expect(name, str, where), where)
        if node.op != "placeholder" or not isinstance(node.meta["val"], torch.Tensor):
            raise GraphFormatError(where, f"{node.name} is not a tensor placeholder")
        return node

    def _gradients(self, parameters: dict[str, fx.Node]) -> dict[str, fx.Node]:
        mapping = expect(self.doc["gradients"], dict, "gradients")
        gradients = {}
        for name, node_name in mapping.items():
            where = f"gradients.{str(name)[:80]}"
            if name not in parameters:
                raise GraphFormatError(where, "not a parameter")
            gradients[name] = self._like(node_name, parameters[name], where)
        return gradients

    def _input_gradients(self, inputs: list[fx.Node]) -> dict[int, fx.Node]:
        mapping = expect(self.doc.get("input_gradients", {}), dict, "input_gradients")
        gradients = {}
        for key, node_name in mapping.items():
            where = f"input_gradients.{str(key)[:20]}"
            if not key.isdigit() or int(key) >= len(inputs):
                raise GraphFormatError(where, f"not the index of one of the {len(inputs)} inputs")
            gradients[int(key)] = self._like(node_name, inputs[int(key)], where)
        return gradients

    def _like(self, node_name: Any, of: fx.Node, where: str) -> fx.Node:
        """The gradient node ``node_name``: a tensor shaped like ``of``."""
        node = self._resolve(expect(node_name, str, where), where)
        val, like = node.meta["val"], of.meta["val"]
        if not isinstance(val, torch.Tensor) or val.shape != like.shape:
            raise GraphFormatError(
                where, f"{node.name} is not a tensor of {of.name}'s shape {list(like.shape)}"
            )
        return node

    def _tied(self, parameters: dict[str, fx.Node]) -> dict[str, list[str]]:
        tied = expect(self.doc.get("tied", {}), dict, "tied")
        check_items(tied, "tied", self.limits)
        result = {}
        for name, others in tied.items():
            if name not in parameters:
                raise GraphFormatError(f"tied.{str(name)[:80]}", "not a parameter")
            others = expect(others, list, f"tied.{name}")
            check_items(others, f"tied.{name}", self.limits)
            result[name] = [self._qualified(o, f"tied.{name}[{i}]") for i, o in enumerate(others)]
        return result

    def _layers(self) -> LayerRepeat | None:
        from strategies.problem.layer_repeat import LayerRepeat
        from strategies.problem.layer_sharing import layer_of

        layers = self.doc.get("layers")
        if layers is None:
            return None
        check_keys(expect(layers, dict, "layers"), "layers", ("captured", "total"))
        captured = expect(layers["captured"], int, "layers.captured")
        total = expect(layers["total"], int, "layers.total")
        held = len({layer_of(path) for path in self.module_path.values()} - {None})
        if captured != held:
            raise GraphFormatError(
                "layers.captured", f"{captured}, but the graph's module paths hold {held} layers"
            )
        try:
            return LayerRepeat(captured, total)
        except ValueError as error:
            raise GraphFormatError("layers", str(error)) from None

    def _qualified(self, name: Any, where: str, empty: bool = False) -> str:
        check_string(expect(name, str, where), where, self.limits)
        if not (QUALIFIED_NAME.match(name) or (empty and name == "")):
            raise GraphFormatError(where, f"{name[:80]!r} is not a dotted name")
        return name


def _check_devices(op: Any, args: tuple, kwargs: dict[str, Any], where: str) -> None:
    """A device argument must be a tagged device (``cpu`` or ``meta``): ATen would take a string too
    (``"cuda"``), and fake CUDA tensors abort some CPU kernels."""
    if op is operator.getitem:
        return
    schema = {argument.name: argument for argument in op._schema.arguments}
    positional = zip(op._schema.arguments, args, strict=False)  # surplus arguments: the op refuses them
    named = [(f"{where}.args[{i}]", a.name, v) for i, (a, v) in enumerate(positional)]
    named += [(f"{where}.kwargs.{key}", key, value) for key, value in kwargs.items()]
    for field, name, value in named:
        argument = schema.get(name)
        if (
            argument is not None
            and "Device" in str(argument.type)
            and not isinstance(value, (torch.device, type(None)))
        ):
            raise GraphFormatError(field, 'a device argument is written {"device": "cpu"} (cpu or meta)')


def _fresh(value: Any) -> Any:
    """A new fake tensor like ``value`` (call inside the fake mode); other values as they are."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    return value


def _text(metas: tuple[Any, ...]) -> str:
    return ", ".join(str(m) for m in metas)


__all__ = ["ImportedGraph", "check_header", "load_graph", "read_graph", "resolve_op"]
