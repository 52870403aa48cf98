"""`autoshard strategies`: parse an op call from the command line, list its strategies as JSON or a table.

Every parse error is a :class:`BadInput` whose message starts with the option it concerns
(``OP``, ``--shapes``, ``--args``, ``--kwargs``, ``--dtype``, ``--mesh``, ``--axis-names``,
``--hardware``), so the command can print one line and exit 2.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from strategies.cost.hardware import HardwareError, get_hardware
from strategies.cost.mesh import Mesh, MeshError, make_mesh
from strategies.ops.generate import OpStrategies, op_strategies
from strategies.placement import NONE, spec_text
from strategies.tensor_meta import TensorMeta, meta_outputs, parse_dtype
from strategies.units import bytes_text

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SOURCES = {
    "autoshard": "autoshard rules",
    "pytorch": "PyTorch's rules (fallback)",
    "replicate": "replicate fallback (no rules anywhere)",
}


class BadInput(ValueError):
    """Input the command cannot use; the message names the option."""


@dataclass(frozen=True)
class Request:
    """One op call on one mesh, parsed from the command line."""

    op: Any
    args: tuple
    kwargs: dict
    mesh: Mesh
    field: str
    """The option the arguments came from (``--shapes`` or ``--args``), for error messages."""


def parse_request(
    op: str,
    shapes: str | None,
    args: str | None,
    kwargs: str | None,
    dtype: str,
    mesh: str,
    axis_names: str | None,
    hardware: str,
) -> Request:
    """Everything the command was given, checked; raises :class:`BadInput` naming the option."""
    overload = resolve_op(op)
    try:
        default_dtype = parse_dtype(dtype)
    except ValueError as error:
        raise BadInput(_as_option(error)) from None
    if (shapes is None) == (args is None):
        raise BadInput("--shapes / --args: give exactly one of them")
    if shapes is not None:
        call_args, field = tuple(parse_shapes(shapes, default_dtype)), "--shapes"
    else:
        call_args, field = tuple(parse_json_args(args or "", "--args", default_dtype, list)), "--args"
    call_kwargs = parse_json_args(kwargs, "--kwargs", default_dtype, dict) if kwargs else {}
    try:
        hw = get_hardware(hardware)
    except HardwareError as error:
        raise BadInput(_as_option(error)) from None
    try:
        the_mesh = make_mesh(mesh, axis_names, hw)
    except MeshError as error:
        raise BadInput(_as_option(error)) from None
    return Request(overload, call_args, call_kwargs, the_mesh, field)


def _as_option(error: Exception) -> str:
    """``"axis_names: ..."`` (a library message naming its field) -> ``"--axis-names: ..."``."""
    field, _, rest = str(error).partition(":")
    option, dot, subfield = field.partition(".")
    return f"--{option.replace('_', '-')}{dot}{subfield}:{rest}"


def resolve_op(name: str) -> Any:
    """``aten.mm.default`` (or ``aten.mm``, ``aten::mm.default``, ``torch.ops.aten.mm``) -> the overload."""
    parts = name.strip().removeprefix("torch.ops.").replace("::", ".").split(".")
    if len(parts) == 2:
        parts.append("default")
    if len(parts) != 3 or not all(_NAME.match(p) for p in parts):
        raise BadInput(f"OP: expected namespace.name.overload such as aten.mm.default, got {name!r}")
    namespace, op_name, overload = parts
    try:
        packet = getattr(getattr(torch.ops, namespace), op_name)
    except (AttributeError, RuntimeError):
        raise BadInput(f"OP: unknown op {namespace}.{op_name}") from None
    if overload not in packet.overloads():
        known = ", ".join(sorted(packet.overloads())) or "none"
        raise BadInput(f"OP: {namespace}.{op_name} has no overload {overload!r}; it has: {known}")
    return getattr(packet, overload)


def parse_shapes(text: str, dtype: torch.dtype) -> list[TensorMeta]:
    """``"64x32,32x16"`` -> two TensorMeta; ``scalar`` (or ``()``) is a 0-D tensor."""
    metas = []
    for piece in text.split(","):
        piece = piece.strip()
        if piece in ("scalar", "()"):
            metas.append(TensorMeta((), dtype))
        elif re.fullmatch(r"\d+(x\d+)*", piece):
            metas.append(TensorMeta(tuple(int(s) for s in piece.split("x")), dtype))
        else:
            raise BadInput(f"--shapes: bad shape {piece!r}; expected sizes joined by 'x' such as 64x32")
    return metas


def parse_json_args(text: str, field: str, dtype: torch.dtype, kind: type) -> Any:
    """A JSON list (``--args``) or object (``--kwargs``) with tensors as ``{"shape": [...]}`` objects."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadInput(f"{field}: not valid JSON: {error}") from None
    if not isinstance(value, kind):
        raise BadInput(f"{field}: expected a JSON {'list' if kind is list else 'object'}")
    if isinstance(value, dict):
        return {k: _decode(v, f"{field}.{k}", dtype) for k, v in value.items()}
    return _decode(value, field, dtype)


def _decode(value: Any, path: str, dtype: torch.dtype) -> Any:
    """JSON values to op arguments: tensor objects to TensorMeta, ``{"dtype": ...}`` to a torch dtype."""
    if isinstance(value, list):
        return [_decode(v, f"{path}[{i}]", dtype) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    unknown = set(value) - {"shape", "dtype"}
    if unknown:
        raise BadInput(
            f"{path}: unknown key {sorted(unknown)[0]!r}; a tensor is {{'shape': [...], 'dtype': ...}}"
        )
    try:
        the_dtype = parse_dtype(value["dtype"]) if "dtype" in value else dtype
    except (ValueError, AttributeError):
        raise BadInput(f"{path}.dtype: unknown dtype {value['dtype']!r}") from None
    if "shape" not in value:
        return the_dtype
    shape = value["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise BadInput(f"{path}.shape: expected a list of non-negative integers, got {shape!r}")
    return TensorMeta(tuple(shape), the_dtype)


def generate(request: Request) -> OpStrategies:
    """The op's strategies; an argument list the op cannot run on is bad input."""
    try:
        outputs = meta_outputs(request.op, request.args, request.kwargs)
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        schema = str(request.op._schema)
        hint = "" if schema in first else f" (schema: {schema})"
        others = [o for o in request.op.overloadpacket.overloads() if o != request.op._overloadname]
        if others:
            hint += f"; other overloads: {', '.join(sorted(others))}"
        raise BadInput(
            f"{request.field}: {request.op} cannot run on {_call_text(request)}: {first}{hint}"
        ) from None
    return op_strategies(request.op, request.args, request.kwargs, request.mesh, outputs=outputs)


def as_records(result: OpStrategies) -> list[dict[str, Any]]:
    """Per strategy: ``output``, ``inputs``, ``compute_s``, ``memory_bytes``, ``redistribute_s``."""
    from_replicate = result.redistribute_from_replicate()
    records = []
    for i in range(len(result)):
        record = result.describe(i)
        record["redistribute_s"] = [_finite(float(s)) for s in from_replicate[:, i]]
        records.append(record)
    return records


def as_table(request: Request, result: OpStrategies) -> str:
    """A title line, then a header and one aligned row per strategy."""
    from_replicate = result.redistribute_from_replicate()
    header = ("#", "output", "inputs", "compute µs", "memory", "redistribute µs")
    rows = [
        (
            str(i),
            "  ".join(
                "-" if meta is None else _spec(result.output_specs[i, k])
                for k, meta in enumerate(result.outputs)
            ),
            "  ".join(_spec(result.input_specs[i, k]) for k in range(len(result.inputs))),
            f"{result.compute_s[i] * 1e6:.2f}",
            bytes_text(int(result.memory_bytes[i])),
            ", ".join(_micros(float(s)) for s in from_replicate[:, i]) or "-",
        )
        for i in range(len(result))
    ]
    mesh = request.mesh
    title = (
        f"{request.op}({_call_text(request)}) on mesh {'x'.join(map(str, mesh.shape))} "
        f"({', '.join(mesh.axis_names)}), {mesh.hardware.name}: {len(result)} strategies from "
        f"{_SOURCES.get(result.source, result.source)}"
    )
    return "\n".join([title, *_align([header, *rows], right={0, 3, 4})])


def _align(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """Rows of cells padded to their column's width; columns in ``right`` aligned right."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]

    def pad(c: int, cell: str) -> str:
        return cell.rjust(widths[c]) if c in right else cell.ljust(widths[c])

    return ["  ".join(pad(c, cell) for c, cell in enumerate(row)).rstrip() for row in rows]


def _call_text(request: Request) -> str:
    def text(value: Any) -> str:
        if isinstance(value, TensorMeta):
            return str(value)
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(text(v) for v in value) + "]"
        return repr(value)

    parts = [text(a) for a in request.args] + [f"{k}={text(v)}" for k, v in request.kwargs.items()]
    return ", ".join(parts)


def _spec(spec: Any) -> str:
    codes = [int(c) for c in spec]
    return "*" if all(c == NONE for c in codes) else "(" + ", ".join(spec_text(codes)) + ")"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _micros(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}" if math.isfinite(seconds) else "inf"
