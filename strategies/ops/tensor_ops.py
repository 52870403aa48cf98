"""Factories, ``operator.getitem`` and indexing ops (the rest of PyTorch's ``_tensor_ops.py``).

- Factories without a tensor argument (``zeros``, ``full``, ``arange``, …) are replicate only: DTensor
  never sees them, every rank builds the whole tensor.
- ``*_like`` factories follow their input's shards; a partial input gives a replicated output (a
  constant is the same on every rank), except ``empty_like`` whose garbage may as well stay partial.
- ``new_*`` factories follow a sharded input of the same shape, like DTensor's ``new_factory_strategy``;
  otherwise the output is replicated and the input is not read.
- ``operator.getitem`` picks one member of an op's tuple output: the output is that member, the
  other members are not read.
- ``index_select``, ``gather``, ``scatter``, ``index.Tensor``: shard any dim the op does not index, or
  the indices (the output then follows them).
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from strategies.ops.registry import OpInfo, Row, register
from strategies.ops.view_ops import VIEW_PARTIALS, follow_rows, normalize_dim
from strategies.placement import LINEAR_PARTIALS, NONE, PARTIALS, R
from strategies.tensor_meta import TensorMeta, flatten_tensors

aten = torch.ops.aten


# ------------------------------------------------------------------------------------------ factories


@register(
    aten.zeros.default,
    aten.ones.default,
    aten.full.default,
    aten.empty.memory_format,
    aten.arange.default,
    aten.arange.start,
    aten.arange.start_step,
    aten.scalar_tensor.default,
)
def factory_rules(info: OpInfo) -> list[Row]:
    """No tensor argument: the all-replicate row, which the registry adds, is the only one."""
    return []


@register(aten.zeros_like.default, aten.ones_like.default, aten.full_like.default)
def constant_like_rules(info: OpInfo) -> list[Row]:
    """Shards follow the input; a partial input gives a replicated constant."""
    ndim = info.inputs[0].ndim
    return [[d, d] for d in range(ndim)] + [[R, p] for p in PARTIALS]


@register(aten.empty_like.default)
def empty_like_rules(info: OpInfo) -> list[Row]:
    """The output takes the input's placement, partial included (DTensor copies the input's spec)."""
    return follow_rows(tuple(range(info.inputs[0].ndim)))


def _partial_beside_shard(info: OpInfo, out_specs: np.ndarray, in_specs: np.ndarray) -> np.ndarray:
    """Drop strategies of initialised ``new_*`` factories whose input is partial on one axis and sharded
    on another: DTensor then copies the whole input spec to the output, partial included, instead of
    the replicated axis the rule promises (and ``new_ones`` would sum to the number of ranks)."""
    if info.op is aten.new_empty.default:
        return np.ones(len(in_specs), dtype=bool)
    inputs = in_specs[:, 0, :]
    return ~(np.isin(inputs, PARTIALS).any(axis=1) & (inputs >= 0).any(axis=1))


@register(
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
    filter=_partial_beside_shard,
)
def new_factory_rules(info: OpInfo) -> list[Row]:
    """Same shape: the output follows a sharded input (and a partial one for ``new_empty``), a partial
    input otherwise gives a replicated output. Another shape: replicated, the input is not read."""
    source, out = info.inputs[0], info.outputs[0]
    if source.shape != out.shape:
        return [[R, NONE]]
    rows: list[Row] = [[d, d] for d in range(out.ndim)]
    if info.op is aten.new_empty.default:
        return rows + [[p, p] for p in PARTIALS]
    return rows + [[R, p] for p in PARTIALS]


# ------------------------------------------------------------------------------------------- getitem


def _picks_a_member(info: OpInfo) -> bool:
    """``getitem`` on an op's tuple (or list) output, the only use of it in aten graphs."""
    return isinstance(info.args[0], (list, tuple))


def _selected_slot(info: OpInfo) -> int | None:
    """Which tensor argument ``operator.getitem`` returns; ``None`` when it returns a non-tensor."""
    members, index = info.args[0], info.args[1]
    if not isinstance(members[index], TensorMeta):
        return None
    return len(flatten_tensors(members[: index % len(members)]))


@register(operator.getitem, kind="view", add_replicate=False)
def getitem_rules(info: OpInfo) -> list[Row]:
    """The output is the selected member, with its placement; the other members are ``NONE`` (not read,
    so the registry's all-replicate row, which would replicate them, is not added). Indexing a tensor
    itself (not an aten graph node) gets the all-replicate row only."""
    if not _picks_a_member(info):
        return []
    slot = _selected_slot(info)
    if slot is None:  # a non-tensor member: nothing is read
        return [[NONE] * (1 + len(info.inputs))]
    codes = [*range(info.inputs[slot].ndim), R, *PARTIALS]
    return [[c, *(c if k == slot else NONE for k in range(len(info.inputs)))] for c in codes]


# ------------------------------------------------------------------------------------------ indexing


@register(aten.index_select.default)
def index_select_rules(info: OpInfo) -> list[Row]:
    """Shard values off the indexed dim (indices whole), or shard the 1-D indices (values whole)."""
    values, index = info.inputs
    dim = normalize_dim(info.arg(1, "dim"), values.ndim)
    rows: list[Row] = [[d, d, R] for d in range(values.ndim) if d != dim]
    if index.ndim == 1:
        rows.append([dim, R, 0])
    return rows + [[p, p, R] for p in VIEW_PARTIALS]


@register(aten.gather.default)
def gather_rules(info: OpInfo) -> list[Row]:
    """Shard a non-gathered dim of the same size in values and indices, or the indices alone on the
    gathered dim (the output has the indices' shape)."""
    values, index = info.inputs
    dim = normalize_dim(info.arg(1, "dim"), values.ndim)
    rows: list[Row] = [[d, d, d] for d in _common_dims(values, index, skip=dim)]
    if index.ndim:
        rows.append([dim, R, dim])
    return rows


@register(aten.scatter.src, aten.scatter.value)
def scatter_rules(info: OpInfo) -> list[Row]:
    """Shard a dim other than the scatter dim on which every tensor argument has the same size."""
    values = info.inputs[0]
    dim = normalize_dim(info.arg(1, "dim"), values.ndim)
    dims = set(range(values.ndim))
    for other in info.inputs[1:]:
        dims &= set(_common_dims(values, other, skip=dim))
    return [[d] * (1 + len(info.inputs)) for d in sorted(dims)]


def _common_dims(a: TensorMeta, b: TensorMeta, skip: int) -> list[int]:
    """Dims other than ``skip`` where two tensors of the same rank have the same size."""
    if a.ndim != b.ndim:
        return []
    return [d for d in range(a.ndim) if d != skip and a.shape[d] == b.shape[d]]


@register(aten.index.Tensor)
def index_rules(info: OpInfo) -> list[Row]:
    """Advanced indexing ``values[indices]`` (``None`` entries keep a dim).

    The indexed dims are replaced by the indices' broadcast dims, at the first indexed dim when the
    indexed dims are adjacent, else in front. Shard a dim that is not indexed (indices whole), or one
    broadcast dim of every index tensor that has it (values whole); sum and average pass through.
    """
    values = info.inputs[0]
    entries = list(info.arg(1, "indices"))
    indexed = [d for d, e in enumerate(entries) if isinstance(e, TensorMeta)]
    indices = [e for e in entries if isinstance(e, TensorMeta)]
    if not indexed or len(indices) != len(info.inputs) - 1:
        return []
    width = max(m.ndim for m in indices)
    adjacent = indexed == list(range(indexed[0], indexed[0] + len(indexed)))
    insert = indexed[0] if adjacent else 0
    rows: list[Row] = []
    for d in range(values.ndim):
        if d not in indexed:
            out = d if d < insert else d + width - sum(i < d for i in indexed)
            rows.append([out, d, *([R] * len(indices))])
    for b in range(width):
        codes = [_broadcast_dim(m, b, width) for m in indices]
        if any(c != R for c in codes):
            rows.append([insert + b, R, *codes])
    return rows + [[p, p, *([R] * len(indices))] for p in LINEAR_PARTIALS]


def _broadcast_dim(index: TensorMeta, b: int, width: int) -> int:
    """The dim of ``index`` on broadcast dim ``b``, or ``R`` where it broadcasts (missing or size 1)."""
    d = b - (width - index.ndim)
    return d if d >= 0 and index.shape[d] != 1 else R
