"""A model calling a custom op registered with ``torch.library``: ``user_ops::soft_clip``, with a fake
kernel (for capture on fake tensors) and an autograd formula. autoshard has no rule for it, nor has
PyTorch's DTensor, so the planner must replicate it and say so in a warning.

``factory()`` returns ``(module, example_inputs)``; the module returns a tensor, so the loss is its sum.
"""

from __future__ import annotations

import torch
from torch import nn

OP_NAME = "user_ops::soft_clip"
BATCH, DIM = 16, 32


@torch.library.custom_op(OP_NAME, mutates_args=())
def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
    """``limit * tanh(x / limit)``: close to ``x`` for small values, never beyond ``±limit``."""
    return limit * torch.tanh(x / limit)


@soft_clip.register_fake
def _(x: torch.Tensor, limit: float) -> torch.Tensor:
    return torch.empty_like(x)


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(output)
    ctx.limit = inputs[1]


def _backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    (output,) = ctx.saved_tensors
    return grad * (1 - (output / ctx.limit) ** 2), None


soft_clip.register_autograd(_backward, setup_context=_setup_context)


class SoftClipMLP(nn.Module):
    def __init__(self, dim: int = DIM, hidden: int = 4 * DIM) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(soft_clip(self.up(x), 3.0))


def factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return SoftClipMLP(), (torch.randn(BATCH, DIM),)
