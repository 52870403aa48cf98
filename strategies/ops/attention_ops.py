"""Scaled dot-product attention: the flash, efficient and cudnn kernels and the CPU flash kernel, forward and
backward (PyTorch's ``_matrix_ops.py``).

Attention mixes every query with every key of the same batch entry and head, so only two dims split
cleanly: the batch dim (0) and the heads dim (1) of everything laid out as ``[batch, heads, ...]`` (q, k,
v, the output, its gradient, the logsumexp, the debug mask, a 4-D bias). One single-axis row per dim; the
all-replicate row is added by the registry. No row is partial: softmax is not linear.

Each op is described by the *role* of every output and tensor argument:

- ``_split``: cut along the row's dim (batch or heads);
- ``_aux``: RNG state, philox seed/offset, cumulative sequence lengths, empty placeholders: kept whole
  (``R``); non-tensor outputs (``SymInt`` max lengths, ``None``) become ``NONE`` in the registry;
- ``_bias``: an attention bias added to the scores ``[batch, heads, L, S]``; a 4-D bias is cut like the
  scores (a broadcast size-1 dim cannot be cut, so that row is dropped, as PyTorch does); the CPU
  kernel's ``attn_mask`` broadcasts (``_broadcast``: size-1 or missing dims stay ``R``).

Grouped-query attention (k, v with ``H_kv`` heads, q with ``g * H_kv``): cutting heads keeps query head
``h`` with kv head ``h // g`` only when both head counts split into equal pieces, so every attention op
rejects uneven shards (``even_only``).

The ``_for_cpu`` ops are what CPU capture produces for ``F.scaled_dot_product_attention``; they are
planned like the flash ops, with FLOPs from ``torch.utils.flop_counter``'s SDPA formulas, and run on
DTensors through :mod:`strategies.ops.dtensor_bridge`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from strategies.ops._einsum import _bias_code
from strategies.ops.registry import OpInfo, Row, register
from strategies.placement import NONE, R
from strategies.tensor_meta import TensorMeta

aten = torch.ops.aten

BATCH, HEADS = 0, 1
SCORES_NDIM = 4
"""``[batch, heads, L, S]``: the shape attention biases and masks broadcast against."""

Role = Callable[[int, TensorMeta | None], int]


def _split(dim: int, meta: TensorMeta | None) -> int:
    return NONE if meta is None else dim


def _aux(dim: int, meta: TensorMeta | None) -> int:
    return NONE if meta is None else R


def _broadcast(dim: int, meta: TensorMeta | None) -> int:
    return NONE if meta is None else _bias_code(dim, SCORES_NDIM, meta.shape)


def _bias(dim: int, meta: TensorMeta | None) -> int:
    if meta is None:
        return NONE
    return dim if meta.ndim == SCORES_NDIM else _bias_code(dim, SCORES_NDIM, meta.shape)


def _split_if(flag: object) -> Role:
    """``_split`` for an output the op fills only when ``flag`` is set; otherwise it is empty: ``R``."""
    return _split if flag else _aux


def tensor_arg_names(info: OpInfo) -> list[str]:
    """Schema names of the tensor arguments, in the registry's flattened order (positional, then keyword)."""
    schema = info.op._schema.arguments
    names = [schema[i].name for i, a in enumerate(info.args) if isinstance(a, TensorMeta)]
    names += [name for name, value in info.kwargs.items() if isinstance(value, TensorMeta)]
    if len(names) != len(info.inputs):
        raise ValueError(f"{info.op}: tensor arguments nested in lists are not expected")
    return names


def attention_rows(info: OpInfo, outputs: Sequence[Role], inputs: Mapping[str, Role]) -> list[Row]:
    """The batch row and the heads row: each output and tensor argument placed by its role.

    Tensor arguments not named in ``inputs`` (philox seed and offset, cumulative lengths) are ``_aux``.
    """
    names = tensor_arg_names(info)
    return [
        [role(dim, meta) for role, meta in zip(outputs, info.outputs, strict=True)]
        + [inputs.get(name, _aux)(dim, meta) for name, meta in zip(names, info.inputs, strict=True)]
        for dim in (BATCH, HEADS)
    ]


QKV: dict[str, Role] = {"query": _split, "key": _split, "value": _split}


# ------------------------------------------------------------------------------------------- forward


@register(aten._scaled_dot_product_flash_attention.default, even_only=True)
def flash_attention_rules(info: OpInfo) -> list[Row]:
    """(output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask)."""
    debug = _split_if(info.arg(5, "return_debug_mask", False))
    outputs = [_split, _split, _aux, _aux, _aux, _aux, _aux, _aux, debug]
    return attention_rows(info, outputs, QKV)


@register(aten._scaled_dot_product_efficient_attention.default, even_only=True)
def efficient_attention_rules(info: OpInfo) -> list[Row]:
    """(output, log_sumexp, philox_seed, philox_offset); log_sumexp is empty unless ``compute_log_sumexp``."""
    outputs = [_split, _split_if(info.arg(4, "compute_log_sumexp")), _aux, _aux]
    return attention_rows(info, outputs, {**QKV, "attn_bias": _bias})


@register(aten._scaled_dot_product_cudnn_attention.default, even_only=True)
def cudnn_attention_rules(info: OpInfo) -> list[Row]:
    """Flash's outputs with philox seed/offset; PyTorch always leaves the debug mask empty: kept whole."""
    lse = _split_if(info.arg(4, "compute_log_sumexp"))
    outputs = [_split, lse, _aux, _aux, _aux, _aux, _aux, _aux, _aux]
    return attention_rows(info, outputs, {**QKV, "attn_bias": _bias})


def _cpu_attention_flops(info: OpInfo, inputs: list[tuple[int, ...]], outputs: list) -> float:
    """``flop_counter``'s SDPA forward count on the local q, k, v shapes."""
    return float(sdpa_flop_count(inputs[0], inputs[1], inputs[2]))


@register(
    aten._scaled_dot_product_flash_attention_for_cpu.default, even_only=True, flops=_cpu_attention_flops
)
def cpu_flash_attention_rules(info: OpInfo) -> list[Row]:
    """(output, logsumexp); the optional ``attn_mask`` broadcasts against the scores."""
    return attention_rows(info, [_split, _split], {**QKV, "attn_mask": _broadcast})


# ------------------------------------------------------------------------------------------ backward

_SAVED = ("grad_out", "query", "key", "value", "out", "logsumexp")


@register(aten._scaled_dot_product_flash_attention_backward.default, even_only=True)
def flash_attention_backward_rules(info: OpInfo) -> list[Row]:
    """(grad_query, grad_key, grad_value) from the saved tensors; cum_seq and philox stay whole."""
    return attention_rows(info, [_split] * 3, {name: _split for name in _SAVED})


@register(aten._scaled_dot_product_efficient_attention_backward.default, even_only=True)
def efficient_attention_backward_rules(info: OpInfo) -> list[Row]:
    """(grad_q, grad_k, grad_v, grad_bias); grad_bias is cut like the bias (``None`` without one)."""
    inputs = {name: _split for name in ("grad_out_", *_SAVED[1:])}
    return attention_rows(info, [_split, _split, _split, _bias], {**inputs, "attn_bias": _bias})


@register(aten._scaled_dot_product_cudnn_attention_backward.default, even_only=True)
def cudnn_attention_backward_rules(info: OpInfo) -> list[Row]:
    """(grad_q, grad_k, grad_v); the bias, when given, is cut like the scores."""
    return attention_rows(info, [_split] * 3, {**{name: _split for name in _SAVED}, "attn_bias": _bias})


def _cpu_attention_backward_flops(info: OpInfo, inputs: list[tuple[int, ...]], outputs: list) -> float:
    """``flop_counter``'s SDPA backward count on the local grad_out, q, k, v shapes."""
    return float(sdpa_backward_flop_count(inputs[0], inputs[1], inputs[2], inputs[3]))


@register(
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    even_only=True,
    flops=_cpu_attention_backward_flops,
)
def cpu_flash_attention_backward_rules(info: OpInfo) -> list[Row]:
    """(grad_query, grad_key, grad_value); ``attn_mask`` broadcasts as in the forward."""
    return attention_rows(info, [_split] * 3, {**{name: _split for name in _SAVED}, "attn_mask": _broadcast})
