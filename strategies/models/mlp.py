"""A two-layer perceptron ``w2(gelu(w1(x)))``: the smallest model with a Megatron-style answer.

With large weights and a small batch the best plan shards ``w1`` by columns and ``w2`` by rows (one
all-reduce per forward); with tiny weights and a big batch it is data parallel. The known-answer tests of
the planner rest on it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """``Linear(dim, hidden) -> GELU -> Linear(hidden, dim)`` on ``[batch, dim]`` inputs."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """The output, or with ``target`` the regression loss ``sum((output - target)^2)``: a loss that,
        unlike a plain sum, needs the whole output on some rank (a sum would let a partial output
        through, so tensor parallelism would never pay for its all-reduce)."""
        out = self.w2(F.gelu(self.w1(x)))
        if target is None:
            return out
        return F.mse_loss(out, target, reduction="sum")
