"""Views and shape ops: ``view``/``reshape``, ``permute``, ``expand``, ``squeeze``, ``split``, ``cat``, …

(PyTorch's ``_view_ops.py`` and the shape part of ``_tensor_ops.py``.)

Every op here is described by one *dim map*: for each input dim, the output dim its shards become,
or ``None`` when a shard of that dim cannot survive the op without moving data. The shared generator
:func:`follow_rows` turns a dim map into single-axis rows (``[S(target), S(dim)]`` for each mapped dim,
plus partials passing straight through, since a view or a copy commutes with every elementwise
reduction).

Reshapes (``view``, ``reshape``, ``_unsafe_view``, ``flatten``) group input and output dims into the
smallest runs whose sizes multiply to the same number (size-1 dims set aside). Within a group only the
outermost input dim may stay sharded, and it lands on the outermost output dim of the group: a shard of
the outermost dim is a contiguous block of the flattened group, and it stays one block of whole rows of
the outermost output dim only when the shard count divides both outermost sizes (``[B, S, 768] ->
[B, S, 12, 64]`` shards ``768`` into ``12`` heads only over 2, 3, 4, 6 or 12 devices). Those ops are
registered ``even_only``, which rejects every uneven split: a rule filter sees placement codes but not
the mesh's axis sizes, so it cannot require even splits of the grouped dims alone; pass-through dims
lose their uneven splits (batch 6 over 4) with it. See :func:`reshape_targets`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from strategies.ops.registry import OpInfo, Row, RuleFn, register
from strategies.placement import PARTIALS

aten = torch.ops.aten

DimTargets = tuple[int | None, ...]
"""Per input dim: the output dim a shard of it becomes, ``None`` when it cannot stay sharded."""

VIEW_PARTIALS = PARTIALS
"""Reductions a view or a copy passes through unchanged (all): it moves elements, never combines them."""


def normalize_dim(dim: int, ndim: int) -> int:
    """``dim`` in ``[0, ndim)`` (``-1`` is the last dim; a 0-D tensor has one position, 0)."""
    return dim % max(ndim, 1)


def follow_rows(
    targets: DimTargets, n_out: int = 1, n_in: int = 1, partials: Sequence[int] = VIEW_PARTIALS
) -> list[Row]:
    """Rows for ops whose outputs follow their inputs: every output ``S(target)`` with every input
    ``S(dim)``, one row per mapped input dim, then one row per reduction the op passes through."""
    rows: list[Row] = [[t] * n_out + [d] * n_in for d, t in enumerate(targets) if t is not None]
    return rows + [[p] * (n_out + n_in) for p in partials]


# ------------------------------------------------------------------------------------------- dim maps


def reshape_targets(in_shape: Sequence[int], out_shape: Sequence[int]) -> DimTargets:
    """Dim map of a reshape: the outermost input dim of each group maps to the group's outermost output dim.

    Groups are the shortest runs of non-1 dims with equal products, e.g. ``[4, 6] -> [2, 12]`` is one
    group (dim 0 maps to dim 0) and ``[B, S, D] -> [B, S, H, Dh]`` is ``B->B``, ``S->S``, ``D->H``.
    A group of one dim on each side is an identity; any other group needs the shard count to divide
    both outermost sizes, which ``even_only`` on the input and output guarantees.
    """
    targets: list[int | None] = [None] * len(in_shape)
    if 0 in in_shape or 0 in out_shape:
        return tuple(targets)
    ins = [d for d, size in enumerate(in_shape) if size != 1]
    outs = [d for d, size in enumerate(out_shape) if size != 1]
    i = o = 0
    while i < len(ins) and o < len(outs):
        targets[ins[i]] = outs[o]
        have, want = in_shape[ins[i]], out_shape[outs[o]]
        i, o = i + 1, o + 1
        while have != want:
            if have < want and i < len(ins):
                have, i = have * in_shape[ins[i]], i + 1
            elif have > want and o < len(outs):
                want, o = want * out_shape[outs[o]], o + 1
            else:  # the sizes do not describe a reshape: nothing stays sharded
                return (None,) * len(in_shape)
    return tuple(targets)


def permute_targets(dims: Sequence[int]) -> DimTargets:
    """Output dim ``i`` is input dim ``dims[i]``, so input dim ``dims[i]`` maps to ``i``."""
    ndim = len(dims)
    targets: list[int | None] = [None] * ndim
    for out_dim, in_dim in enumerate(dims):
        targets[normalize_dim(in_dim, ndim)] = out_dim
    return tuple(targets)


def expand_targets(in_shape: Sequence[int], out_shape: Sequence[int]) -> DimTargets:
    """Dims kept at their size move right by the number of new leading dims; broadcast dims are lost."""
    offset = len(out_shape) - len(in_shape)
    return tuple(d + offset if size == out_shape[d + offset] else None for d, size in enumerate(in_shape))


def keep_targets(ndim: int, frozen: int | None) -> DimTargets:
    """Every dim maps to itself except ``frozen`` (the dim a slice, split or cat cuts along)."""
    return tuple(None if d == frozen else d for d in range(ndim))


def drop_targets(ndim: int, removed: int) -> DimTargets:
    """Dim ``removed`` disappears (``select``, ``unbind``): later dims move one left."""
    return tuple(None if d == removed else d - (d > removed) for d in range(ndim))


def insert_targets(ndim: int, inserted: int) -> DimTargets:
    """A new dim appears at ``inserted`` (``stack``): dims from there on move one right."""
    return tuple(d + (d >= inserted) for d in range(ndim))


# ---------------------------------------------------------------------------------------------- views


def register_view(*ops: Any, even_only: bool = False) -> Callable[[RuleFn], RuleFn]:
    """``register`` for ops returning aliases of their input: no kernel, no cost; one reduction per tensor."""
    return register(*ops, kind="view", even_only=even_only)


@register_view(
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.flatten.using_ints,
    even_only=True,
)
def reshape_rules(info: OpInfo) -> list[Row]:
    """Shards follow :func:`reshape_targets`. ``reshape`` of a non-contiguous tensor copies, but captured
    graphs hold ``view`` or ``clone`` + ``_unsafe_view`` instead, so it is costed as a view."""
    return follow_rows(reshape_targets(info.inputs[0].shape, info.outputs[0].shape))


@register_view(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default)
def squeeze_rules(info: OpInfo) -> list[Row]:
    """Adding or removing size-1 dims keeps every other dim whole: uneven shards are fine."""
    return follow_rows(reshape_targets(info.inputs[0].shape, info.outputs[0].shape))


@register_view(aten.permute.default)
def permute_rules(info: OpInfo) -> list[Row]:
    return follow_rows(permute_targets(info.arg(1, "dims")))


@register_view(aten.transpose.int)
def transpose_rules(info: OpInfo) -> list[Row]:
    ndim = info.inputs[0].ndim
    dims = list(range(ndim))
    if ndim:
        a, b = normalize_dim(info.arg(1, "dim0"), ndim), normalize_dim(info.arg(2, "dim1"), ndim)
        dims[a], dims[b] = dims[b], dims[a]
    return follow_rows(permute_targets(dims))


@register_view(aten.expand.default)
def expand_rules(info: OpInfo) -> list[Row]:
    return follow_rows(expand_targets(info.inputs[0].shape, info.outputs[0].shape))


@register_view(aten.split.Tensor, aten.split_with_sizes.default)
def split_rules(info: OpInfo) -> list[Row]:
    """Every piece keeps the input's placement; the split dim itself must be whole."""
    ndim = info.inputs[0].ndim
    targets = keep_targets(ndim, normalize_dim(info.arg(2, "dim", 0), ndim))
    return follow_rows(targets, n_out=len(info.outputs))


@register_view(aten.unbind.int)
def unbind_rules(info: OpInfo) -> list[Row]:
    ndim = info.inputs[0].ndim
    targets = drop_targets(ndim, normalize_dim(info.arg(1, "dim", 0), ndim))
    return follow_rows(targets, n_out=len(info.outputs))


@register_view(aten.select.int)
def select_rules(info: OpInfo) -> list[Row]:
    ndim = info.inputs[0].ndim
    return follow_rows(drop_targets(ndim, normalize_dim(info.arg(1, "dim"), ndim)))


@register_view(aten.slice.Tensor)
def slice_rules(info: OpInfo) -> list[Row]:
    """The sliced dim must be whole, unless the slice takes all of it (DTensor's redundant slice)."""
    shape = info.inputs[0].shape
    dim = normalize_dim(info.arg(1, "dim", 0), len(shape))
    whole = _takes_everything(shape[dim], info.arg(2, "start"), info.arg(3, "end"), info.arg(4, "step", 1))
    return follow_rows(keep_targets(len(shape), None if whole else dim))


def _takes_everything(size: int, start: int | None, end: int | None, step: int) -> bool:
    start = 0 if start is None else start
    end = sys.maxsize if end is None else end
    return step == 1 and (start == 0 or start <= -size) and end >= size


# ------------------------------------------------------------------------------------- concatenation


@register(aten.cat.default)
def cat_rules(info: OpInfo) -> list[Row]:
    """All pieces share one placement; the cat dim must be whole. Mixed ranks (legacy empty
    tensors) are replicate only."""
    ndims = {m.ndim for m in info.inputs}
    if len(ndims) != 1:
        return []
    ndim = ndims.pop()
    targets = keep_targets(ndim, normalize_dim(info.arg(1, "dim", 0), ndim))
    return follow_rows(targets, n_in=len(info.inputs))


@register(aten.stack.default)
def stack_rules(info: OpInfo) -> list[Row]:
    """All pieces share one placement; the new dim is whole, the ones after it move right."""
    ndim = info.inputs[0].ndim
    targets = insert_targets(ndim, normalize_dim(info.arg(1, "dim", 0), ndim + 1))
    return follow_rows(targets, n_in=len(info.inputs))
