"""Registers autoshard's rules with DTensor for ops DTensor has no sharding strategy for."""

from __future__ import annotations


def register_with_dtensor() -> None:
    """Make DTensor able to run the ops only autoshard knows how to shard."""
