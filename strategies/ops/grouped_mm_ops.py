"""Grouped matrix products, the experts of a mixture-of-experts layer: ``aten._grouped_mm`` and
``autoshard::grouped_mm(Tensor a, Tensor b, Tensor ends, Tensor starts) -> Tensor``.

``aten._grouped_mm(a, b, offs)`` runs one matrix product per group (expert): ``offs`` holds each group's
end along the grouped dim, a group starting where the one before it ends. Rows of the tokens sorted by
expert are the grouped dim of the forward (``[tokens, k] x [experts, k, n]``); the weight gradient groups
the contracted dim (``[k, tokens] x [tokens, n] -> [experts, k, n]``). Its ends are global offsets, so no
rule can cut the experts: a rank holding experts ``4..7`` would need ``offs[3]``, where its groups begin.

``autoshard::grouped_mm`` is the same product with each group's start next to its end, which is what
expert parallelism needs: cut the experts' dim of the weights, of ``ends`` and of ``starts`` alike and
every rank computes its own experts' rows, from tokens it holds whole, with the bounds of its groups in its
own pieces. What no local group covers is zero, so the forward's output is a partial sum over the expert
axis (``P``: its reduction brings every token's expert result back, what the all-to-all combine of
expert-parallel frameworks does), and the weight gradient comes out cut by expert. Tokens reach their
experts by replicating them on the expert axis (an all-gather where they were cut: Megatron's "allgather"
token dispatcher); DTensor has no placement for a data-dependent all-to-all. The graph pass
:mod:`strategies.graph.experts` puts this op in place of every ``_grouped_mm`` with offsets.

Forms, per (``a.ndim``, ``b.ndim``), as einsums of one group with the grouped letter:

=========  ===================  ===============  ==============================================
form       one group            grouped by       expert-parallel row (out, a, b, ends, starts)
=========  ===================  ===============  ==============================================
2d x 3d    ``mk,gkn->mn``       rows ``m``       ``P, R, S(0), S(0), S(0)``
3d x 2d    ``gmk,kn->mn``       columns ``n``    ``P, S(0), R, S(0), S(0)``
2d x 2d    ``mk,kn->gmn``       contracted ``k`` ``S(0), R, R, S(0), S(0)``
=========  ===================  ===============  ==============================================

Both ops also take the einsum's rows minus any cut of the grouped letter (group bounds stay whole), and one
operand partial with the other whole (the product is linear in each).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from strategies.ops._einsum import einsum_rules
from strategies.ops.registry import OpInfo, Row, register
from strategies.placement import P, R

aten = torch.ops.aten


@torch.library.custom_op(
    "autoshard::grouped_mm",
    mutates_args=(),
    schema="(Tensor a, Tensor b, Tensor ends, Tensor starts) -> Tensor",
)
def grouped_mm(a: Tensor, b: Tensor, ends: Tensor, starts: Tensor) -> Tensor:
    """Group ``g`` spans ``starts[g]:ends[g]`` of the grouped dim (table above); what no group spans is 0.

    One ``mm`` per non-empty group after a single read of the bounds: exact for any dtype, layout and
    shard (the fused kernel wants 16-byte aligned strides that local shards need not have). No autograd:
    the op only ever replaces products of a graph that is already differentiated.
    """
    out = a.new_zeros(_output_shape(a, b, ends, starts))
    for group, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if end <= start:
            continue
        if a.ndim == 2 and b.ndim == 3:
            out[start:end] = a[start:end] @ b[group]
        elif a.ndim == 3:
            out[:, start:end] = a[group] @ b[:, start:end]
        else:
            out[group] = a[:, start:end] @ b[start:end]
    return out


@grouped_mm.register_fake
def _grouped_mm_fake(a: Tensor, b: Tensor, ends: Tensor, starts: Tensor) -> Tensor:
    return a.new_empty(_output_shape(a, b, ends, starts))


def _output_shape(a: Tensor, b: Tensor, ends: Tensor, starts: Tensor) -> tuple[int, ...]:
    """The output's shape, after the checks that name what does not fit."""
    name = "autoshard::grouped_mm"
    if (a.ndim, b.ndim) not in GROUPED_FORMS:
        raise ValueError(f"{name}: operands of {a.ndim} and {b.ndim} dims (2d x 3d, 3d x 2d or 2d x 2d)")
    if a.dtype != b.dtype:
        raise ValueError(f"{name}: operands have dtypes {a.dtype} and {b.dtype}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{name}: contracted sizes {a.shape[-1]} and {b.shape[-2]} differ")
    groups = b.shape[0] if b.ndim == 3 else a.shape[0] if a.ndim == 3 else ends.shape[0]
    if ends.shape != (groups,) or starts.shape != (groups,):
        raise ValueError(f"{name}: ends {list(ends.shape)}, starts {list(starts.shape)}: expected [{groups}]")
    if a.ndim == 2 and b.ndim == 2:
        return (groups, a.shape[0], b.shape[1])
    return (a.shape[-2], b.shape[-1])


GROUPED_MM = torch.ops.autoshard.grouped_mm.default
"""The op overload :mod:`strategies.graph.experts` inserts and strategies are registered for."""


GROUPED_FORMS: dict[tuple[int, int], tuple[str, tuple[int, int], Row]] = {
    (2, 3): ("mk,gkn->mn", (0, 0), (P, R, 0)),
    (3, 2): ("gmk,kn->mn", (1, 1), (P, 0, R)),
    (2, 2): ("mk,kn->gmn", (0, 1), (0, R, R)),
}
"""Per (``a.ndim``, ``b.ndim``) with group bounds: the einsum of one group, the (operand, dim) the bounds
cut into groups, and the expert-parallel placements of (output, a, b) (module docstring's table)."""


def grouped_rows(a_ndim: int, b_ndim: int, bounds: int, expert_parallel: bool) -> list[Row]:
    """Rows of a grouped product with ``bounds`` group-bound tensors after ``a`` and ``b``: the einsum's rows
    minus cuts of the grouped dim and the two partial rows, bounds whole; with ``expert_parallel`` (and
    bounds), the row cutting the experts' dim of every tensor that has it, bounds included."""
    linear = [[P, P, R], [P, R, P]]
    if (a_ndim, b_ndim) == (3, 3):  # a batched mm: no bounds, no grouped dim
        return [*einsum_rules("gmk,gkn->gmn"), *linear]
    equation, (operand, dim), experts_row = GROUPED_FORMS[(a_ndim, b_ndim)]
    rows = [row for row in [*einsum_rules(equation), *linear] if row[1 + operand] != dim]
    rows = [[*row, *(R for _ in range(bounds))] for row in rows]
    if expert_parallel and bounds:
        rows.append([*experts_row, *(0 for _ in range(bounds))])
    return rows


def grouped_mm_flops(info: OpInfo, in_shapes: list[tuple[int, ...]], out_shapes: list) -> float:
    """``2 m k n`` over the tokens the local groups hold: with the groups cut ``c`` ways, a rank's groups
    hold ``1/c`` of them on average (the bounds are data: the even share is what a plan can price)."""
    a, b = in_shapes[0], in_shapes[1]
    if len(a) == 3 and len(b) == 3:
        return 2.0 * math.prod(a) * b[-1]
    m, k, n = a[-2], a[-1], b[-1]
    if len(a) == 3:  # columns of the output are split among the groups
        groups_local, groups = a[0], info.inputs[0].shape[0]
        return 2.0 * m * k * n * groups_local / groups
    if len(b) == 3:  # rows of the output are split among the groups
        groups_local, groups = b[0], info.inputs[1].shape[0]
        return 2.0 * m * k * n * groups_local / groups
    out = out_shapes[0]  # 2d x 2d: the contracted dim is split among the groups
    groups_local, groups = out[0], info.outputs[0].shape[0]
    return 2.0 * m * k * n * groups_local / groups


@register(aten._grouped_mm.default, flops=grouped_mm_flops)
def aten_grouped_mm_rules(info: OpInfo) -> list[Row]:
    """``offs`` are global ends, so no expert-parallel row (module docstring). The 16-byte stride alignment
    the kernels require of the local operands is not checked here: a rule filter does not see the mesh
    sizes that determine local sizes."""
    self_, mat2, *rest = info.inputs
    if info.arg(3, "bias") is not None:
        return []
    return grouped_rows(self_.ndim, mat2.ndim, len(rest), expert_parallel=False)


@register(GROUPED_MM, flops=grouped_mm_flops)
def autoshard_grouped_mm_rules(info: OpInfo) -> list[Row]:
    """The aten op's rows and the expert-parallel one (module docstring)."""
    a, b, *bounds = info.inputs
    return grouped_rows(a.ndim, b.ndim, len(bounds), expert_parallel=True)
