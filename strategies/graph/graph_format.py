"""The graph document (``"format": "autoshard.graph"``, version 1): names, bounds, errors and value codecs.

A launcher exports its captured training step as JSON (:mod:`strategies.graph.export`) and the service
rebuilds it (:mod:`strategies.graph.imported`) without importing or running any code the document names.
This module holds what both sides share: the format's name and version, the size bounds a reader enforces
(:class:`GraphLimits`), the error a reader raises (:class:`GraphFormatError`, naming the field) and the
encoding of argument and output values. ``docs/graph-format.md`` describes the whole document.

Values are plain JSON where JSON is unambiguous (ints, finite floats, bools, ``null``, strings, lists);
everything else is an object with exactly one tag key::

    {"node": "mm_3"}            an fx node (arguments only)
    {"tuple": [...]}            a Python tuple (a JSON list is a Python list)
    {"float": "inf"}            a float JSON cannot write: "inf", "-inf" or "nan"
    {"dtype": "bfloat16"}       a torch.dtype
    {"device": "cpu"}           a torch.device
    {"layout": "strided"}       a torch.layout
    {"memory_format": "contiguous_format"}
    {"tensor": {"shape": [8, 16], "stride": [16, 1], "dtype": "float32"}}   a fake tensor (outputs only)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

FORMAT = "autoshard.graph"
VERSION = 1

PASSES = ("expose_sequence_dims", "exact_mean_losses")
"""The graph passes a version-1 document has been through, in order (:mod:`strategies.graph.passes`)."""

ALLOWED_NAMESPACES = ("aten", "prims", "autoshard")
"""Op namespaces a document may name: ``torch.ops.<namespace>.<op>.<overload>``, plus ``operator.getitem``."""
GETITEM = "operator.getitem"

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
"""A node name: a Python identifier (fx keeps such names as they are)."""
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*\Z")
"""A parameter, buffer or module path: dotted identifiers (``layers.0.attention.wq.weight``)."""
OP_PART = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*\Z")
"""One part of an op name; dunder names are refused before any lookup."""
DEVICE = re.compile(r"(cpu|meta)\Z")
"""Devices an argument may name: graphs are captured on fake CPU tensors (fake CUDA ones abort)."""
MAX_INT = 2**63 - 1
"""Ints are int64 in ATen."""


@dataclass(frozen=True)
class GraphLimits:
    """Bounds a reader enforces; a document past one is refused with :class:`GraphTooLarge` (HTTP 413)."""

    max_bytes: int = 64 * 2**20
    """Length of the JSON text (for :func:`~strategies.graph.imported.read_graph`)."""
    max_nodes: int = 100_000
    """Entries of ``nodes`` (a 4-layer Llama capture has about 1,000; GPT-2 small, all 12 layers, 2,600)."""
    max_depth: int = 8
    """Nesting of one argument or output value (``[[1, 2]]`` in ``args`` is depth 2)."""
    max_items: int = 4096
    """Elements of one list, tuple or object (and of ``nodes``' role maps)."""
    max_string: int = 512
    """Characters of any string (names, op names, module paths, string arguments)."""
    max_rank: int = 16
    """Dims of a tensor."""
    max_numel: int = 2**62
    """Elements of a tensor (fake: nothing is allocated, but sizes must stay int64)."""


DEFAULT_LIMITS = GraphLimits()


class GraphFormatError(ValueError):
    """A graph document the reader refuses; ``field`` is a path into the document (``nodes[12].args[1]``).

    ``status`` is the HTTP status a service answers with: 422 for a document that breaks the format.
    """

    status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class GraphTooLarge(GraphFormatError):
    """A document past one of the :class:`GraphLimits` (HTTP 413)."""

    status = 413


class GraphExportError(ValueError):
    """A captured graph holds something version 1 of the format cannot write (an op outside the allowed
    namespaces, a value of another type)."""


def _named(kind: type, prefix: str = "") -> dict[str, Any]:
    """Name -> value for every torch attribute of ``kind`` (``torch.float32`` is ``"float32"``)."""
    return {prefix + name: value for name, value in vars(torch).items() if isinstance(value, kind)}


DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in _named(torch.dtype).values()}
LAYOUTS: dict[str, torch.layout] = {str(v).removeprefix("torch."): v for v in _named(torch.layout).values()}
MEMORY_FORMATS: dict[str, torch.memory_format] = {
    str(v).removeprefix("torch."): v for v in _named(torch.memory_format).values()
}
_TAGGED_TYPES: tuple[tuple[str, type, dict[str, Any]], ...] = (
    ("dtype", torch.dtype, DTYPES),
    ("layout", torch.layout, LAYOUTS),
    ("memory_format", torch.memory_format, MEMORY_FORMATS),
)


# ------------------------------------------------------------------------------------------- encoding


def encode_value(value: Any, node_name: Callable[[Any], str | None], where: str) -> Any:
    """``value`` (an fx argument or a node's ``meta["val"]``) as JSON; ``node_name`` names an fx node
    (None for anything else). A type the format lacks raises :class:`GraphExportError` naming ``where``."""
    name = node_name(value)
    if name is not None:
        return {"node": name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v, node_name, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode_value(v, node_name, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, torch.Tensor):
        shape = [int(s) for s in value.shape]
        stride = [int(s) for s in value.stride()]
        return {
            "tensor": {"shape": shape, "stride": stride, "dtype": str(value.dtype).removeprefix("torch.")}
        }
    if isinstance(value, torch.device):
        return {"device": str(value)}
    for tag, kind, _ in _TAGGED_TYPES:
        if isinstance(value, kind):
            return {tag: str(value).removeprefix("torch.")}
    raise GraphExportError(
        f"{where}: a {type(value).__name__} value ({value!r}) has no encoding in version 1"
    )


# ------------------------------------------------------------------------------------------- decoding


@dataclass
class ValueReader:
    """Decodes values of one document: ``resolve`` turns a node name into its fx node (or raises the
    error naming the field), ``fake_mode`` makes fake tensors for ``{"tensor": ...}``."""

    limits: GraphLimits
    resolve: Callable[[str, str], Any] | None
    fake_mode: Any = None

    def read(self, value: Any, where: str, depth: int = 1) -> Any:
        if depth > self.limits.max_depth:
            raise GraphTooLarge(where, f"nested deeper than {self.limits.max_depth} levels")
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if not -MAX_INT - 1 <= value <= MAX_INT:
                raise GraphFormatError(where, f"integer {value} does not fit in int64")
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise GraphFormatError(where, 'a non-finite float must be written {"float": "inf"}')
            return value
        if isinstance(value, str):
            return check_string(value, where, self.limits)
        if isinstance(value, list):
            check_items(value, where, self.limits)
            return [self.read(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return self._tagged(value, where, depth)
        raise GraphFormatError(where, f"a {type(value).__name__} is not a graph value")

    def _tagged(self, value: dict, where: str, depth: int) -> Any:
        if len(value) != 1:
            raise GraphFormatError(where, f"a tagged value has exactly one key, got {sorted(value)[:5]}")
        ((tag, inner),) = value.items()
        at = f"{where}.{tag}"
        if tag == "node" and self.resolve is not None:
            return self.resolve(expect(inner, str, at), at)
        if tag == "tuple":
            check_items(expect(inner, list, at), at, self.limits)
            return tuple(self.read(v, f"{at}[{i}]", depth + 1) for i, v in enumerate(inner))
        if tag == "float":
            if inner not in ("inf", "-inf", "nan"):
                raise GraphFormatError(at, f'expected "inf", "-inf" or "nan", got {inner!r}')
            return float(inner)
        if tag == "device":
            if not DEVICE.match(expect(inner, str, at)):
                raise GraphFormatError(at, f"unknown device {inner[:40]!r} (cpu or meta)")
            return torch.device(inner)
        if tag == "tensor" and self.fake_mode is not None:
            return self._tensor(expect(inner, dict, at), at)
        for name, _, table in _TAGGED_TYPES:
            if tag == name:
                return lookup(table, expect(inner, str, at), at, name)
        raise GraphFormatError(where, f"unknown tag {tag[:40]!r} here")

    def _tensor(self, spec: dict, where: str) -> torch.Tensor:
        check_keys(spec, where, required=("shape", "stride", "dtype"))
        shape = self._sizes(spec["shape"], f"{where}.shape")
        stride = self._sizes(spec["stride"], f"{where}.stride")
        if len(stride) != len(shape):
            raise GraphFormatError(f"{where}.stride", f"{len(stride)} strides for {len(shape)} dims")
        if math.prod(shape) > self.limits.max_numel:
            raise GraphTooLarge(f"{where}.shape", f"more than {self.limits.max_numel} elements")
        dtype = lookup(DTYPES, expect(spec["dtype"], str, f"{where}.dtype"), f"{where}.dtype", "dtype")
        with self.fake_mode:
            return torch.empty_strided(shape, stride, dtype=dtype, device="cpu")

    def _sizes(self, sizes: Any, where: str) -> list[int]:
        expect(sizes, list, where)
        if len(sizes) > self.limits.max_rank:
            raise GraphTooLarge(where, f"more than {self.limits.max_rank} dims")
        for i, size in enumerate(sizes):
            if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_INT:
                raise GraphFormatError(f"{where}[{i}]", f"expected a non-negative int64, got {size!r}")
        return sizes


def expect(value: Any, kind: type, where: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is no int here), else the error naming ``where``."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        got = "null" if value is None else type(value).__name__
        raise GraphFormatError(where, f"expected {_JSON_NAMES.get(kind, kind.__name__)}, got {got}")
    return value


_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def check_keys(obj: dict, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """Every required key present, no key outside required + optional."""
    for key in required:
        if key not in obj:
            raise GraphFormatError(f"{where}.{key}" if where else key, "missing")
    for key in obj:
        if key not in required and key not in optional:
            shown = key[:40] if isinstance(key, str) else repr(key)
            raise GraphFormatError(f"{where}.{shown}" if where else shown, "unknown field")


def check_string(value: str, where: str, limits: GraphLimits) -> str:
    if len(value) > limits.max_string:
        raise GraphTooLarge(where, f"string longer than {limits.max_string} characters")
    return value


def check_items(items: list | dict, where: str, limits: GraphLimits) -> None:
    if len(items) > limits.max_items:
        raise GraphTooLarge(where, f"more than {limits.max_items} items")


FIXED_BY_GRAPH = ("batch", "seq", "layers", "options")
"""Plan request fields a graph document fixes itself (its shapes and the model's configuration)."""


def check_beside_graph(fields: Mapping[str, Any]) -> None:
    """Refuse a plan request that sets beside a graph a field the graph fixes (``ValueError`` naming it)."""
    for name in FIXED_BY_GRAPH:
        if fields.get(name) not in (None, {}):
            raise ValueError(f"{name}: a graph fixes its own shapes and configuration; leave {name} unset")


def lookup(table: dict[str, Any], name: str, where: str, what: str) -> Any:
    if name not in table:
        raise GraphFormatError(where, f"unknown {what} {name[:40]!r}")
    return table[name]


__all__ = [
    "ALLOWED_NAMESPACES",
    "DEFAULT_LIMITS",
    "FIXED_BY_GRAPH",
    "FORMAT",
    "PASSES",
    "VERSION",
    "GraphExportError",
    "GraphFormatError",
    "GraphLimits",
    "GraphTooLarge",
    "check_beside_graph",
    "encode_value",
]
