"""The dominance kernel against its definition, on random and hand-made feature matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solver.dominance import LEARN_ROWS, PROBE_COLUMNS, dominated_rows
from tests.solver.random_problems import beaten_by_definition

INF = math.inf
NAN = math.nan


def random_features(rng: np.random.Generator) -> np.ndarray:
    """Few distinct values (ties everywhere), copied rows, constant columns, +-inf, NaN; sometimes more rows
    than the kernel learns its column order from and more columns than it probes, sometimes huge values
    next to tiny ones (sums that round)."""
    rows = int(rng.integers(1, 2 * LEARN_ROWS + 10))
    width = int(rng.integers(1, 6 * PROBE_COLUMNS))
    values = rng.integers(0, int(rng.integers(1, 5)), (rows, width)).astype(float)
    for _ in range(int(rng.integers(0, rows))):
        values[rng.integers(rows)] = values[rng.integers(rows)]
    if rng.random() < 0.3:
        values[:, rng.integers(width)] = rng.integers(0, 3)
    if rng.random() < 0.2:
        values[:, rng.integers(width)] = 1e20
        values *= rng.choice([1.0, 1e-5])
    for special, rate in ((INF, 0.1), (-INF, 0.02), (NAN, 0.01)):
        if rng.random() < 0.5:
            values[rng.random(values.shape) < rate] = special
    return values


def test_dominated_rows_matches_the_definition_on_random_matrices() -> None:
    rng = np.random.default_rng(3)
    for case in range(600):
        values = random_features(rng)
        assert dominated_rows(values).tolist() == beaten_by_definition(values).tolist(), case


def test_a_beaten_row_can_differ_from_its_beater_in_the_last_column_only() -> None:
    rng = np.random.default_rng(5)
    base = rng.integers(0, 100, (LEARN_ROWS + 20, 4 * PROBE_COLUMNS)).astype(float)
    values = np.vstack([base, base])
    values[len(base) :, -1] += 1  # each copy is worse than its original in the very last column
    expected = [False] * len(base) + [True] * len(base)
    assert dominated_rows(values).tolist() == beaten_by_definition(values).tolist() == expected


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([[1, 2]], [False]),
        ([[1, 2], [1, 2]], [False, True]),  # equal rows: the first survives
        ([[2, 2], [1, 2]], [True, False]),
        ([[1, 3], [2, 2]], [False, False]),  # incomparable
        ([[INF, 0], [INF, 0]], [False, True]),
        ([[-INF, 0], [0, 0]], [False, True]),
        ([[NAN, 0], [NAN, 0]], [False, False]),  # NaN: never beaten, never beats
        ([[0, NAN], [1, 1]], [False, False]),
        ([[5], [3], [3], [4]], [True, False, True, True]),
    ],
)
def test_dominated_rows_on_one_and_two_rows_and_special_values(
    rows: list[list[float]], expected: list[bool]
) -> None:
    values = np.array(rows, dtype=float)
    assert beaten_by_definition(values).tolist() == expected
    assert dominated_rows(values).tolist() == expected


def test_dominated_rows_accepts_any_layout_and_integer_input() -> None:
    values = np.array([[3, 1, 2], [1, 1, 1], [2, 0, 2]])
    expected = beaten_by_definition(values.astype(float)).tolist()
    assert dominated_rows(values).tolist() == expected
    assert dominated_rows(np.asfortranarray(values.astype(float))).tolist() == expected
