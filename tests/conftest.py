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


#: The modules that take a minute or more of the suite, longest first (their times: benchmarks/README.md, "The
#: test suite's time"). `make test` hands whole modules to its two processes in collection order
#: (`--dist loadfile`), and the top-level modules come last: the docs' and the example launcher's tests left
#: one process running them alone at the end. Handed out first, the short modules fill in behind them.
LONGEST_FIRST = (
    "tests/service/test_hostile_clients.py",
    "tests/runtime/test_planned_step.py",
    "tests/runtime/test_zoo.py",
    "tests/service/test_cli_run.py",
    "tests/service/test_e2e.py",
    "tests/service/jobs/test_runner.py",
    "tests/strategies/ops/test_conformance_pointwise.py",
    "tests/test_docs.py",
    "tests/strategies/ops/test_conformance_math.py",
    "tests/solver/test_solve.py",
    "tests/test_example_train.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = {path: rank for rank, path in enumerate(LONGEST_FIRST)}
    items.sort(
        key=lambda item: order.get(item.nodeid.partition("::")[0], len(order))
    )  # stable: the rest as found
