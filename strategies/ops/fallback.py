"""Fallbacks for ops autoshard has no rules for."""

from __future__ import annotations

from strategies.registry import OpInfo, Row


def pytorch_rows(info: OpInfo) -> list[Row] | None:
    return None
