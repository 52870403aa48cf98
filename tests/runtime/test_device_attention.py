"""The CPU flash-attention ops of a CPU capture get a kernel on a GPU (runtime/device_attention.py).

No GPU here: the math kernels are checked against PyTorch's own CPU kernel on CPU tensors (forward and
backward, float32 and bfloat16, causal and masked), and their registration under the CUDA dispatch key.
"""

from __future__ import annotations

import pytest
import torch

from runtime.device_attention import attention_backward, attention_forward, register_for

aten = torch.ops.aten
CASES = [
    (dtype, causal, masked)
    for dtype in (torch.float32, torch.bfloat16)
    for causal, masked in ((False, False), (True, False), (False, True))
]


@pytest.mark.parametrize(("dtype", "causal", "masked"), CASES)
def test_the_math_kernels_equal_the_cpu_flash_kernels(dtype, causal, masked) -> None:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 16, generator=generator).to(dtype) for _ in range(3))
    mask = torch.randn(2, 1, 8, 8, generator=generator).to(dtype) if masked else None
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask)
    grad = torch.randn(out.shape, generator=generator).to(dtype)
    want = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask
    )
    got_out, got_lse = attention_forward(q, k, v, 0.0, causal, attn_mask=mask)
    got = attention_backward(grad, q, k, v, out, lse, 0.0, causal, attn_mask=mask)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert got_out.dtype == dtype and got_lse.dtype == lse.dtype == torch.float32
    torch.testing.assert_close(got_lse, lse, atol=tolerance, rtol=tolerance)
    for name, a, b in zip(("output", "query", "key", "value"), (got_out, *got), (out, *want), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a.float(), b.float(), atol=tolerance, rtol=tolerance, msg=name)


def test_dropout_is_refused_by_name() -> None:
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(NotImplementedError, match=r"dropout 0\.1"):
        attention_forward(q, q, q, 0.1)


def test_the_kernels_are_registered_for_cuda_once_and_never_for_cpu() -> None:
    name = "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert not register_for("cpu")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
    first = register_for("cuda")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name + "_backward", "CUDA")
    assert first and not register_for("cuda")
