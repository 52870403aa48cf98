"""Fixtures shared across the test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gloo_ranks import GlooRanks


class _RanksHolder:
    """The session's one gloo group, replaced when a module left it unusable."""

    def __init__(self) -> None:
        self.pool: GlooRanks | None = None

    def healthy(self) -> GlooRanks:
        if self.pool is None or not self.pool.healthy:
            self.close()
            self.pool = GlooRanks()
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


@pytest.fixture(scope="session")
def _ranks_holder() -> Iterator[_RanksHolder]:
    holder = _RanksHolder()
    try:
        yield holder
    finally:
        holder.close()


@pytest.fixture(scope="module")
def ranks(_ranks_holder: _RanksHolder) -> GlooRanks:
    """Four gloo ranks (`tests.gloo_ranks`), shared by every module that asks for them."""
    return _ranks_holder.healthy()
