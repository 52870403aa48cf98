"""The ``export`` half of :mod:`benchmarks.compute_calibration`: plan a model and write, per op node of the
plan that computes, the call one device makes (local shapes, the other arguments) and its predicted seconds.

Each op node's chosen strategy gives every tensor argument's placement; its local shape is the largest
piece (``strategies.cost.comm.local_sizes``), its non-tensor arguments are kept as captured. A call is written
only when it is right on local shapes: the op run on meta tensors of the local shapes must give the local
output shapes the strategy promises. Arguments that name global sizes (a view's shape, a split's sizes)
fail that check and the node is listed as skipped with the reason; ``embedding_dense_backward``'s
``num_weights`` is the one such argument rewritten (to the rows of the local weight gradient). Views cost
nothing in the model and are only counted. Identical calls are merged: ``count`` nodes, run
``step_weight`` times a step (the sum of the nodes' weights: middle layers of a layer repeat stand for
several layers).

This module imports autoshard; the ``measure`` half must not (it runs where only torch is installed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_map

from benchmarks.compute_calibration import FORMAT, op_family
from strategies.cost.comm import local_sizes
from strategies.plan.planner import PlanRequest, plan_model
from strategies.problem.builder import BuiltProblem, ProblemNode
from strategies.tensor_meta import TensorMeta, dtype_name, flatten_tensors, meta_outputs

aten = torch.ops.aten
MAX_NAMES = 6
"""Node names kept per merged record."""


class Skip(ValueError):
    """The node's call cannot be rebuilt on local shapes; the message says why."""


def export_records(request: PlanRequest, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Plan ``request`` and return the records document (see the module docstring)."""
    outcome = plan_model(request, progress)
    chosen = np.asarray(outcome.result.solution, dtype=np.int64)
    doc = records_of(outcome.built, chosen)
    hw = outcome.built.mesh.hardware
    doc["request"] = outcome.plan["request"]
    doc["hardware"] = {
        "name": hw.name,
        "peak_flops": hw.peak_flops,
        "memory_bandwidth": hw.memory_bandwidth,
        "launch_s": hw.launch_s,
        "sustained_efficiency": hw.sustained_efficiency,
    }
    doc["mesh"] = outcome.plan["mesh"]
    doc["layers"] = outcome.plan.get("layers")
    doc["solver"] = {k: outcome.plan["solver"][k] for k in ("backend", "status", "gap")}
    doc["plan_compute_s"] = outcome.plan["predicted"]["compute_s"]
    return doc


def records_of(built: BuiltProblem, chosen: np.ndarray) -> dict[str, Any]:
    """Records of every computing op node of ``built`` under the strategies ``chosen``, merged, and the
    nodes skipped; ``records_compute_s + skipped_compute_s`` is the plan's compute time."""
    weights = built.node_weights()
    merged: dict[str, dict[str, Any]] = {}
    skipped: list[dict[str, Any]] = []
    zero = 0
    for i, node in enumerate(built.nodes):
        if node.kind != "op":
            continue
        seconds = float(node.compute_s[chosen[i]])
        if seconds <= 0:
            zero += 1
            continue
        weight = float(weights[i])
        try:
            record = call_record(node, int(chosen[i]), built.mesh.shape)
        except Skip as reason:
            skipped.append(
                {"name": node.name, "op": str(node.op), "reason": str(reason), "predicted_s": seconds}
                | {"weight": weight}
            )
            continue
        record["predicted_s"] = seconds
        key = json.dumps({k: record[k] for k in ("op", "inputs", "args", "kwargs", "predicted_s")})
        if key not in merged:
            merged[key] = record | {"count": 0, "step_weight": 0.0, "nodes": []}
        into = merged[key]
        into["count"] += 1
        into["step_weight"] += weight
        if len(into["nodes"]) < MAX_NAMES:
            into["nodes"].append(node.name)
    records = sorted(merged.values(), key=lambda r: -r["step_weight"] * r["predicted_s"])
    by_op: dict[str, int] = {}
    for s in skipped:
        by_op[s["op"]] = by_op.get(s["op"], 0) + 1
    return {
        "format": FORMAT,
        "records": records,
        "skipped": skipped,
        "skipped_by_op": by_op,
        "zero_compute_nodes": zero,
        "records_compute_s": sum(r["step_weight"] * r["predicted_s"] for r in records),
        "skipped_compute_s": sum(s["weight"] * s["predicted_s"] for s in skipped),
    }


def call_record(node: ProblemNode, strategy: int, mesh_shape: tuple[int, ...]) -> dict[str, Any]:
    """One node's call on one device under ``strategy``: op, local input tensors, encoded arguments, local
    outputs; :class:`Skip` when it cannot be rebuilt on local shapes."""
    op_name = _op_name(node.op)
    if node.call is None:
        raise Skip("no recorded arguments")
    args, kwargs = node.call
    metas = flatten_tensors((args, kwargs))
    specs = node.input_specs[strategy]
    if len(metas) != len(specs):
        raise Skip(f"{len(metas)} tensor arguments but {len(specs)} placements")
    local = iter([_local(m, specs[k], mesh_shape) for k, m in enumerate(metas)])
    args, kwargs = tree_map(lambda x: next(local) if isinstance(x, TensorMeta) else x, (args, kwargs))
    outputs = [
        None if m is None else _local(m, node.output_specs[strategy, k], mesh_shape)
        for k, m in enumerate(node.outputs)
    ]
    args = _localise(node.op, args, outputs)
    _check_outputs(node.op, args, kwargs, outputs)
    inputs = flatten_tensors((args, kwargs))
    tensors = [{"shape": list(m.shape), "dtype": dtype_name(m.dtype)} for m in inputs]
    for k, high in _index_bounds(node.op, inputs, args).items():
        tensors[k]["high"] = high
    counter = iter(range(len(inputs)))
    record = {
        "op": op_name,
        "family": op_family(op_name),
        "inputs": tensors,
        "args": [encode(a, counter) for a in args],
        "kwargs": {k: encode(v, counter) for k, v in kwargs.items()},
        "outputs": [
            None if o is None else {"shape": list(o.shape), "dtype": dtype_name(o.dtype)} for o in outputs
        ],
    }
    if next(counter, None) is not None:
        raise Skip("some tensor arguments were not written")
    return record


def _local(meta: TensorMeta, spec: np.ndarray, mesh_shape: tuple[int, ...]) -> TensorMeta:
    """The largest local piece of a tensor placed by ``spec``."""
    return TensorMeta(tuple(int(v) for v in local_sizes(spec[None], meta.shape, mesh_shape)[0]), meta.dtype)


def _check_outputs(op: Any, args: tuple, kwargs: dict, outputs: list[TensorMeta | None]) -> None:
    """:class:`Skip` unless ``op`` on meta tensors of the local shapes gives the local ``outputs``."""
    try:
        got = meta_outputs(op, args, kwargs)
    except Exception as error:
        raise Skip(f"does not run on local shapes: {type(error).__name__}: {_first_line(error)}") from None
    if list(got) != outputs:
        raise Skip(
            f"arguments depend on global shapes: on local inputs it gives {[g and str(g) for g in got]}, "
            f"the strategy's local outputs are {[o and str(o) for o in outputs]}"
        )


def encode(value: Any, tensors: Any) -> Any:
    """A JSON value that :func:`benchmarks.compute_calibration.decode` turns back into ``value``; tensors
    become ``{"tensor": k}`` (``k`` from the iterator ``tensors``, in flattening order)."""
    if isinstance(value, TensorMeta):
        return {"tensor": next(tensors)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        return [encode(v, tensors) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": None}
    raise Skip(f"argument of type {type(value).__name__} cannot be written: {value!r}")


def _op_name(op: Any) -> str:
    """``aten.mm.default``: the namespace, packet and overload, as ``torch.ops`` resolves them."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        raise Skip(f"{op!r} is not a torch op")
    namespace, name = schema.name.split("::")
    return f"{namespace}.{name}.{schema.overload_name or 'default'}"


def _localise(op: Any, args: tuple, outputs: list[TensorMeta | None]) -> tuple:
    """Arguments that name a global size and have a local meaning: ``embedding_dense_backward``'s
    ``num_weights`` is the rows of the local weight gradient."""
    if op is aten.embedding_dense_backward.default and outputs[0] is not None:
        return (*args[:2], outputs[0].shape[0], *args[3:])
    return args


def _index_bounds(op: Any, inputs: list[TensorMeta], args: tuple) -> dict[int, int]:
    """Integer inputs that index something: tensor position -> exclusive upper bound of valid values.
    Other integer tensors are filled with zeros by ``measure``."""
    name = getattr(getattr(op, "overloadpacket", None), "__name__", "")
    if name == "embedding":
        return {1: inputs[0].shape[0]}
    if name == "embedding_dense_backward":
        return {1: int(args[2])}
    if name in ("nll_loss_forward", "nll_loss2d_forward"):
        return {1: _classes(inputs[0])}
    if name in ("nll_loss_backward", "nll_loss2d_backward"):
        return {2: _classes(inputs[1])}
    return {}


def _classes(logits: TensorMeta) -> int:
    return logits.shape[1] if logits.ndim >= 2 else logits.shape[0]


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [""])[0][:200]


__all__ = ["Skip", "call_record", "encode", "export_records", "records_of"]
