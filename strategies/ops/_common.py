"""Small rule generators shared by several op families."""

from __future__ import annotations

from strategies.ops.registry import Row
from strategies.placement import P


def partial_passthrough(slots: int, reductions: tuple[int, ...] = (P,)) -> list[Row]:
    """Rows keeping every slot partial, one row per reduction the op commutes with (default: sum)."""
    return [[p] * slots for p in reductions]
