"""The CPU flash-attention ops of a CPU-captured graph, runnable on a GPU.

Graphs are captured on fake CPU tensors (TORCH_NOTES: fake CUDA tensors abort in SDPA on a CPU-only build),
so attention appears in a plan as ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward,
ops with a CPU kernel only. A CUDA worker runs the same graph node by node, so it needs those two ops on
its device: :func:`register_for` gives them a kernel for a device type that has none, written with matmuls
and a softmax in float32 (the ops' own semantics: output and log-sum-exp forward; gradients of query, key and
value from the saved output and log-sum-exp backward, the way flash attention recomputes). Plans, op names
and sharding rules stay those of the capture; only the kernel under the op changes.

The math kernel holds one ``[batch, heads, L, S]`` score matrix per call (per rank: the local heads), where
a fused kernel would hold none: at long sequences a worker may prefer capturing on its own device (a plan
made there names the device's own kernels).
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten
FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"

_libraries: dict[str, torch.library.Library] = {}


def register_for(device_type: str) -> bool:
    """Give the two CPU flash-attention ops a kernel on ``device_type`` (``cuda``, ...) unless they already
    have one there; whether a kernel was registered now."""
    if device_type == "cpu" or device_type in _libraries:
        return False
    key = {"cuda": "CUDA", "xpu": "XPU", "mps": "MPS"}.get(device_type, device_type.upper())
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{FORWARD}", key):
        return False
    library = torch.library.Library("aten", "IMPL")
    library.impl(FORWARD, attention_forward, key)
    library.impl(BACKWARD, attention_backward, key)
    _libraries[device_type] = library
    return True


def attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, logsumexp)`` as the CPU flash kernel returns them (``logsumexp`` in float32,
    ``[batch, heads, L]``)."""
    _no_dropout(dropout_p)
    scores = _scores(query, key, is_causal, attn_mask, scale)
    logsumexp = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - logsumexp.unsqueeze(-1))
    output = torch.matmul(weights, value.float()).to(query.dtype)
    return output, logsumexp


def attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of query, key and value, the attention weights recomputed from the saved log-sum-exp."""
    _no_dropout(dropout_p)
    scale_value = _scale(query, scale)
    weights = torch.exp(_scores(query, key, is_causal, attn_mask, scale) - logsumexp.float().unsqueeze(-1))
    grad = grad_out.float()
    grad_value = torch.matmul(weights.transpose(-2, -1), grad)
    grad_weights = torch.matmul(grad, value.float().transpose(-2, -1))
    row_dot = (grad * out.float()).sum(dim=-1, keepdim=True)
    grad_scores = weights * (grad_weights - row_dot)
    grad_query = torch.matmul(grad_scores, key.float()) * scale_value
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), query.float()) * scale_value
    return grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype)


def _scores(
    query: torch.Tensor,
    key: torch.Tensor,
    is_causal: bool,
    attn_mask: torch.Tensor | None,
    scale: float | None,
) -> torch.Tensor:
    """``query @ key^T * scale`` in float32 with the causal and explicit masks applied."""
    scores = torch.matmul(query.float(), key.float().transpose(-2, -1)) * _scale(query, scale)
    length, source = scores.shape[-2], scores.shape[-1]
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.float()
    return scores


def _scale(query: torch.Tensor, scale: float | None) -> float:
    return scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])


def _no_dropout(dropout_p: float) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"attention: dropout {dropout_p} in a CPU-captured graph on a GPU (the CPU kernel's random "
            "stream cannot be reproduced); capture with dropout 0"
        )
