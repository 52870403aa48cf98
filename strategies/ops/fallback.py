"""Fallback rules for ops autoshard has none for: PyTorch's own sharding rules, read through DTensor.

DTensor keeps two registries in ``DTensor._op_dispatcher.sharding_propagator``:

- ``op_single_dim_strategy_funcs``: rules written for one mesh axis, exactly our rows. Called as
  ``fn(op, args, kwargs)`` with torch's ``TensorMeta(shape, stride, dtype)`` for tensors (a tuple of them
  for a list of tensors); each row is ``[outputs..., tensor inputs...]`` of placements, with
  ``_ShardingPlaceholder(d)`` for "shard dim d", ``None`` for an output that is not computed, and the
  all-replicate row left out.
- ``op_strategy_funcs``: functions producing a whole ``OpStrategy`` for given input strategies on a
  mesh. On a 1-D mesh of 2 devices built without ranks, with every input offered in each placement it
  could have (``R``, ``S(d)``, ``P``), every ``OpSpec`` that comes back is one single-axis row. Some of
  these functions follow one input, or refuse some combinations, so they are also called with single
  placements (all inputs alike, then one input at a time) and the rows are pooled.

Placements are converted to our codes (:mod:`strategies.placement`); rows holding anything without a
code (``_StridedShard``, ``Partial`` subclasses such as norm or mask partials, unknown reductions) or of
the wrong length are dropped. Whatever goes wrong inside PyTorch, :func:`pytorch_rows` returns
``None`` and generation falls back to replicate-only; it never raises.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from strategies.ops.registry import OpInfo, Row
from strategies.placement import NONE, P_AVG, P_MAX, P_MIN, P, R
from strategies.tensor_meta import TensorMeta

log = logging.getLogger("autoshard.strategies")

_REDUCTIONS = {"sum": P, "avg": P_AVG, "max": P_MAX, "min": P_MIN}
_PROBE_MESH_SIZE = 2
_MAX_SINGLE_INPUT_PROBES = 64


class _Unconvertible(Exception):
    """A PyTorch placement or row with no equivalent among our codes."""


def pytorch_rows(info: OpInfo) -> list[Row] | None:
    """PyTorch's single-axis rows for ``info.op`` in our codes, or ``None`` when it has none we can use.

    An empty list means PyTorch knows the op and allows only replication.
    """
    try:
        propagator = _propagator()
        single = propagator.op_single_dim_strategy_funcs.get(info.op)
        if single is not None:
            rows = _single_dim_rows(info, single)
            if rows is not None:
                return rows
        full = propagator.op_strategy_funcs.get(info.op)
        if full is not None:
            return _full_strategy_rows(info, full)
    except Exception as error:  # PyTorch internals: any failure means "no rules"
        log.debug("PyTorch's strategy for %s failed: %s: %s", info.op, type(error).__name__, error)
    return None


@functools.cache
def _propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


# ------------------------------------------------------------------------------------- conversion


def _code(placement: Any, meta: TensorMeta | None) -> int:
    """Our code for one DTensor placement (or placeholder) of a tensor described by ``meta``."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder

    if placement is None or meta is None:
        return NONE
    if isinstance(placement, _ShardingPlaceholder) or type(placement) is Shard:
        dim = int(placement.dim)
        if not -meta.ndim <= dim < meta.ndim:
            raise _Unconvertible(f"shard dim {dim} of a {meta.ndim}-D tensor")
        return dim % meta.ndim
    if isinstance(placement, Replicate):
        return R
    if type(placement) is Partial and placement.reduce_op in _REDUCTIONS:
        return _REDUCTIONS[placement.reduce_op]
    raise _Unconvertible(f"placement {placement!r}")


def _output_slots(info: OpInfo, entries: int) -> list[list[int]]:
    """For each of PyTorch's output entries, the indices of ``info.outputs`` it describes.

    PyTorch lists one entry per tensor return of the schema; we list one per returned value (a
    ``Tensor[]`` return gives one per element, a ``SymInt`` return a non-tensor slot).
    """
    n_out = len(info.outputs)
    if entries == n_out:
        return [[k] for k in range(n_out)]
    tensors = [k for k, meta in enumerate(info.outputs) if meta is not None]
    returns = getattr(getattr(info.op, "_schema", None), "returns", None) or []
    if len(returns) == n_out:
        tensor_returns = [j for j, r in enumerate(returns) if "Tensor" in str(r.type)]
        if entries == len(tensor_returns):
            return [[j] for j in tensor_returns]
    if entries == 1 and tensors:  # one spec for every output (a Tensor[] return, or DTensor's own rule)
        return [tensors]
    raise _Unconvertible(f"{entries} output entries for {n_out} outputs")


def _convert_row(info: OpInfo, outputs: Sequence[Any], inputs: Sequence[Any]) -> list[int]:
    """One of our rows from PyTorch's output and input placements of one mesh axis."""
    if len(inputs) != len(info.inputs):
        raise _Unconvertible(f"{len(inputs)} inputs for {len(info.inputs)} tensor arguments")
    row = [NONE] * len(info.outputs)
    for placement, slots in zip(outputs, _output_slots(info, len(outputs)), strict=True):
        for k in slots:  # no spec for a tensor output: DTensor hands back each rank's whole local value
            row[k] = (
                R if placement is None and info.outputs[k] is not None else _code(placement, info.outputs[k])
            )
    return row + [_code(p, meta) for p, meta in zip(inputs, info.inputs, strict=True)]


def _collect(info: OpInfo, candidates: Iterable[tuple[Sequence[Any], Sequence[Any]]]) -> list[list[int]]:
    """Distinct converted rows, in order; unconvertible ones dropped (and logged at debug level)."""
    rows: list[list[int]] = []
    for outputs, inputs in candidates:
        try:
            row = _convert_row(info, outputs, inputs)
        except _Unconvertible as why:
            log.debug("%s: dropping PyTorch row %s -> %s: %s", info.op, inputs, outputs, why)
            continue
        if row not in rows:
            rows.append(row)
    return rows


def _torch_meta(meta: TensorMeta) -> Any:
    """torch's ``TensorMeta`` (shape, contiguous stride, dtype) for ours."""
    from torch.distributed.tensor._dtensor_spec import TensorMeta as TorchMeta

    return TorchMeta(torch.Size(meta.shape), _contiguous_stride(meta.shape), meta.dtype)


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def _map_tensors(value: Any, leaf: Callable[[TensorMeta], Any], group: Callable[[list], Any]) -> Any:
    """One argument with each TensorMeta replaced by ``leaf(meta)``; a list of only tensors by ``group``.

    This is how DTensor hands arguments over: a list of tensors becomes one ``TupleStrategy`` (a tuple of
    metas for single-axis rules), a mixed list (``index``'s ``[None, idx]``) stays a list.
    """
    if isinstance(value, TensorMeta):
        return leaf(value)
    if isinstance(value, (list, tuple)):
        mapped = [_map_tensors(v, leaf, group) for v in value]
        if value and all(isinstance(v, TensorMeta) for v in value):
            return group(mapped)
        return type(value)(mapped)
    return value


# ------------------------------------------------------------------------------- single-axis rules


def _single_dim_rows(info: OpInfo, fn: Callable) -> list[list[int]] | None:
    """Rows of a single-axis rule function; ``None`` when it gave rows but none could be converted."""
    args = tuple(_map_tensors(a, _torch_meta, tuple) for a in info.args)
    kwargs = {k: _map_tensors(v, _torch_meta, tuple) for k, v in info.kwargs.items()}
    raw = fn(info.op, args, kwargs)
    n_in = len(info.inputs)
    rows = _collect(info, ((row[: len(row) - n_in], row[len(row) - n_in :]) for row in raw))
    if raw and not rows:
        return None
    return rows


# ----------------------------------------------------------------------------- full strategy functions


@functools.cache
def _probe_mesh() -> Any:
    """A 1-D mesh of two devices with no process group: enough to ask strategy functions."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", torch.arange(_PROBE_MESH_SIZE), _init_backend=False, _rank=0)


def _candidates(meta: TensorMeta) -> list[Any]:
    """Every placement a tensor could arrive in on one axis: ``R``, ``S(d)`` where it fits, ``P``."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    shards = [Shard(d) for d, size in enumerate(meta.shape) if size >= _PROBE_MESH_SIZE]
    partial = [Partial()] if meta.dtype.is_floating_point else []
    return [Replicate(), *shards, *partial]


def _probes(info: OpInfo) -> list[list[list[Any]]]:
    """Per probe, the placements offered for each tensor input (flattened order).

    First every candidate for every input; then each placement offered to all inputs that can take
    it (others ``R``); then, for a few inputs, one input at a time in each placement (others ``R``).
    """
    from torch.distributed.tensor import Replicate

    options = [_candidates(meta) for meta in info.inputs]
    probes = [options]
    distinct = list(dict.fromkeys(p for opts in options for p in opts))
    for p in distinct:
        probes.append([[p] if p in opts else [Replicate()] for opts in options])
    if sum(len(o) for o in options) <= _MAX_SINGLE_INPUT_PROBES:
        for i, opts in enumerate(options):
            for p in opts:
                probes.append([[p] if j == i else [Replicate()] for j in range(len(options))])
    return probes


def _full_strategy_rows(info: OpInfo, fn: Callable) -> list[list[int]] | None:
    """Rows from a whole-``OpStrategy`` function, asked on a 1-D probe mesh; ``None`` if every ask failed."""
    if not info.inputs:
        return None
    rows: list[list[int]] = []
    answered = False
    for offered in _probes(info):
        try:
            specs = _ask(info, fn, offered)
        except Exception as error:  # some combinations are refused by raising
            log.debug("%s: PyTorch's strategy refused %s: %s", info.op, offered, error)
            continue
        answered = True
        for row in _collect(info, specs):
            if row not in rows:
                rows.append(row)
    return rows if answered else None


def _ask(info: OpInfo, fn: Callable, offered: list[list[Any]]) -> list[tuple[list[Any], list[Any]]]:
    """Call ``fn`` with inputs offered in the given placements; ``(outputs, inputs)`` per OpSpec."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy

    mesh = _probe_mesh()
    offers = iter(offered)

    def strategy(meta: TensorMeta) -> OpStrategy:
        torch_meta = _torch_meta(meta)
        return OpStrategy([OpSpec(DTensorSpec(mesh, (p,), tensor_meta=torch_meta)) for p in next(offers)])

    args = tuple(_map_tensors(a, strategy, TupleStrategy) for a in info.args)
    kwargs = {k: _map_tensors(v, strategy, TupleStrategy) for k, v in info.kwargs.items()}
    result = fn(OpSchema(info.op, args, kwargs))
    if not isinstance(result, OpStrategy):
        raise _Unconvertible(f"{type(result).__name__} result")
    return [_spec_placements(spec, len(info.inputs)) for spec in result.strategies]


def _spec_placements(spec: Any, n_inputs: int) -> tuple[list[Any], list[Any]]:
    """The single-axis output and input placements of one ``OpSpec``."""
    outputs = list(spec.output_specs) if isinstance(spec.output_specs, (tuple, list)) else [spec.output_specs]
    if spec.input_specs is None:  # DTensor's rule: every input takes the (single) output spec
        if len(outputs) != 1:
            raise _Unconvertible("no input specs for several outputs")
        inputs = [outputs[0]] * n_inputs
    else:
        inputs = list(spec.input_specs)
    return (
        [None if s is None else s.placements[0] for s in outputs],
        [None if s is None else s.placements[0] for s in inputs],
    )
