"""Matrix products: ``t``, ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``dot`` (PyTorch's ``_matrix_ops.py``)."""

from __future__ import annotations

import torch

from strategies.ops._common import partial_passthrough
from strategies.ops._einsum import einsum_rules
from strategies.registry import OpInfo, Row, register

aten = torch.ops.aten


@register(aten.mm.default)
def mm_rules(info: OpInfo) -> list[Row]:
    return einsum_rules("mk,kn->mn")


@register(aten.addmm.default)
def addmm_rules(info: OpInfo) -> list[Row]:
    return einsum_rules("mk,kn->mn", bias_shape=info.inputs[0].shape)


@register(aten.bmm.default)
def bmm_rules(info: OpInfo) -> list[Row]:
    return einsum_rules("bmk,bkn->bmn")


@register(aten.baddbmm.default)
def baddbmm_rules(info: OpInfo) -> list[Row]:
    return einsum_rules("bmk,bkn->bmn", bias_shape=info.inputs[0].shape)


@register(aten.dot.default)
def dot_rules(info: OpInfo) -> list[Row]:
    return einsum_rules("i,i->")


@register(aten.t.default, kind="view")
def t_rules(info: OpInfo) -> list[Row]:
    """Transposing swaps the dims a shard names; 0-D and 1-D tensors pass through."""
    ndim = info.inputs[0].ndim
    swapped = [[d, d] for d in range(ndim)] if ndim < 2 else [[1, 0], [0, 1]]
    return swapped + partial_passthrough(2)
