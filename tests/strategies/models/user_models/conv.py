"""A small convolutional classifier with batch norm, and an explicit loss function.

``factory()`` returns ``(module, example_inputs, loss_fn)``: the module maps images ``[N, 3, 16, 16]`` to
class logits; ``loss_fn`` is the cross-entropy against fixed labels it holds (a closure, as users write it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

BATCH, CLASSES = 8, 10


class ConvNet(nn.Module):
    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, kernel_size=3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1, bias=False),
            nn.GroupNorm(4, 2 * channels),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(2 * channels, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))


def factory() -> tuple[nn.Module, tuple[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    torch.manual_seed(0)
    labels = torch.randint(CLASSES, (BATCH,))

    def loss_fn(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels)

    return ConvNet(), (torch.randn(BATCH, 3, 16, 16),), loss_fn
