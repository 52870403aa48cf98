"""Tiny ``transformers`` models of the zoo (``tests/strategies/models/user_models/zoo.py``) with dropout 0:
factories (``path/file.py:function``) for the tests of ops and placements that must not depend on random
masks (sharded dropout is tested on its own)."""

from __future__ import annotations

import torch

from tests.strategies.models.user_models import zoo


def t5() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The zoo's T5 without dropout (its ``fill_.Tensor`` has no DTensor rule)."""
    return zoo.t5(dropout_rate=0.0)
