"""Matrix products: ``t``, ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``dot``, the float8 ``_scaled_mm``, and
``constant_pad_nd`` (PyTorch's ``_matrix_ops.py``; the experts' ``_grouped_mm`` is in
:mod:`strategies.ops.grouped_mm_ops`)."""

from __future__ import annotations

import torch

from strategies.ops._common import partial_passthrough
from strategies.ops._einsum import einsum_rules
from strategies.ops.registry import OpInfo, Row, register
from strategies.placement import P_AVG, P_MAX, P_MIN, P, R
from strategies.tensor_meta import TensorMeta

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


# ---------------------------------------------------------------------------------------- _scaled_mm


def _scale_code(data_code: int, scale: TensorMeta, contracting_dim: int) -> int | None:
    """The placement of a ``_scaled_mm`` scale given its operand's, ``None`` when no placement works.

    A tensor-wise scale (one element) stays whole; a row-wise scale (``[M, 1]`` for ``self``, ``[1, N]`` for
    ``mat2``) is cut like its operand (a cut of its size-1 dim is dropped by the shardability filter); a 1-D
    blockwise scale (``[M * K / block]``) follows a cut of the free dim as ``S(0)`` and cannot follow a cut
    of the contracting dim, whose blocks it interleaves.
    """
    if scale.numel == 1:
        return R
    if scale.ndim != 1:
        return data_code
    if data_code == contracting_dim:
        return None
    return 0 if data_code >= 0 else R


def _is_float8(meta: TensorMeta | None) -> bool:
    return meta is not None and meta.dtype.is_floating_point and meta.itemsize == 1


@register(aten._scaled_mm.default)
def scaled_mm_rules(info: OpInfo) -> list[Row]:
    """``(self * scale_a) @ (mat2 * scale_b)``: ``mm``'s rows, each scale placed by :func:`_scale_code`.

    No operand is ever partial: float8 operands come out of a saturating cast, which does not commute with
    a sum. A contracting-dim cut makes the output partial, which needs an output wider than float8 (the
    reduction happens after the kernel's saturating cast). DTensor refuses ``bias`` and ``scale_result``,
    so with either the op stays whole.
    """
    _self, _mat2, scale_a, scale_b, *rest = info.inputs
    if rest:
        return []
    rows = []
    for out, a, b in einsum_rules("mk,kn->mn"):
        codes = (_scale_code(a, scale_a, contracting_dim=1), _scale_code(b, scale_b, contracting_dim=0))
        if None in codes or (out == P and _is_float8(info.outputs[0])):
            continue
        rows.append([out, a, b, *codes])
    return rows


# ------------------------------------------------------------------------------------ constant_pad_nd


@register(aten.constant_pad_nd.default)
def constant_pad_nd_rules(info: OpInfo) -> list[Row]:
    """Cut any dim the op does not pad. A partial input stays partial where every rank writes the same
    constant ``v`` and the reduction of ``v, ..., v`` is ``v``: avg, max and min always, sum only for
    ``v == 0`` (or with no padding at all). One reduction per tensor across mesh axes (DTensor's limit)."""
    ndim = info.inputs[0].ndim
    pad = list(info.arg(1, "pad"))
    padded = {ndim - 1 - i // 2 for i, amount in enumerate(pad) if amount != 0}
    cuts = [[d, d] for d in range(ndim) if d not in padded]
    sum_ok = not padded or info.arg(2, "value", 0) == 0
    return cuts + partial_passthrough(2, (P, P_AVG, P_MAX, P_MIN) if sum_ok else (P_AVG, P_MAX, P_MIN))
