"""The memory model of mixed precision against a hand count, on a model whose memory is its weight: one
bias-free 1024 x 1024 linear layer on one device, a batch of 8 (its activations: 0.01% of the weight).

By hand, bytes per weight element at the step's peak:
- fp32 parameters, bf16 compute: 4 (the fp32 weight) + 8 (Adam's two fp32 moments) + 2 (the weight's
  gradient, made in bf16) + 4 (its cast back to fp32, made while the bf16 one is still there) = 18. The bf16
  copy of the weight (2) is gone by then: the backward reads only the input for the weight's gradient.
- all fp32: 4 + 8 + 4 (the gradient) = 16; all bf16: 2 + 4 (Adam's moments in bf16, as torch's AdamW keeps a
  bf16 parameter's) + 2 = 8.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoshard

ELEMENTS = 1024 * 1024


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(1024, 1024, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x).pow(2).mean()


@pytest.mark.parametrize(
    ("param_dtype", "compute_dtype", "bytes_per_element"),
    [(torch.float32, "bfloat16", 18), (torch.float32, None, 16), (torch.bfloat16, None, 8)],
)
def test_the_peak_is_the_hand_count(param_dtype, compute_dtype, bytes_per_element) -> None:
    module = Linear().to(param_dtype)
    x = torch.randn(8, 1024, dtype=param_dtype)
    plan = autoshard.plan(module, (x,), "1", compute_dtype=compute_dtype, recompute="none", time_limit=5)
    assert plan.peak_memory_bytes == pytest.approx(bytes_per_element * ELEMENTS, rel=5e-3)
