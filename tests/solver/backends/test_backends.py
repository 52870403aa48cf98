"""Every exact backend equals brute force on random small problems (the program of `solver.ilp`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solver.backends import BACKEND_NAMES, get_backend
from solver.backends.base import INFEASIBLE, OPTIMAL, BackendLimits, Started
from solver.backends.cpsat import objective_scale
from solver.compact import compact
from solver.errors import InfeasibleError
from solver.evaluate import evaluate
from solver.ilp import build_program, memory_row_times
from tests.solver.random_problems import brute_force, random_problem

PROBLEMS_PER_BACKEND = 120


def _solve_raw(problem, backend: str):
    """Solve without reductions or heuristics: only the program and the backend are under test."""
    core = compact(problem)
    try:
        program = build_program(core)
    except InfeasibleError:
        return None, None
    result = get_backend(backend).solve(program, BackendLimits(20, 1))
    if result.status == INFEASIBLE:
        return None, None
    assert result.status == OPTIMAL, result
    return result, core.lift(result.assignment)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_backend_matches_brute_force(backend: str) -> None:
    rng = np.random.default_rng(7 + BACKEND_NAMES.index(backend))
    infeasible = limited = 0
    for case in range(PROBLEMS_PER_BACKEND):
        problem = random_problem(rng, groups=case % 3 == 0, pins=case % 4 == 0)
        expected, _ = brute_force(problem)
        result, solution = _solve_raw(problem, backend)
        limited += problem.usage_limit is not None
        if expected is None:
            infeasible += 1
            assert result is None, f"case {case}: brute force says infeasible, {backend} found {result}"
            continue
        assert result is not None, f"case {case}: {backend} says infeasible, optimum is {expected}"
        evaluation = evaluate(problem, solution)
        assert evaluation.feasible, (case, evaluation.violations)
        assert evaluation.cost == expected, (
            f"case {case}: {backend} {evaluation.cost} != brute force {expected}"
        )
        assert result.objective == pytest.approx(expected)
        assert result.bound <= expected + 1e-6
    assert infeasible >= 5 and limited >= 40, (
        "the random mix must include infeasible and memory-limited cases"
    )


def test_warm_start_is_accepted_and_kept_when_optimal() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        problem = random_problem(rng, with_limit=False, forbidden_rate=0.0)
        expected, best = brute_force(problem)
        core = compact(problem)
        program = build_program(core)
        warm = best[np.unique(core.node_of, return_index=True)[1]]
        for backend in BACKEND_NAMES:
            result = get_backend(backend).solve(program, BackendLimits(10, 1), warm_start=warm)
            assert result.objective == pytest.approx(expected)


def test_memory_rows_are_only_the_maximal_time_steps() -> None:
    starts = np.array([30, 40, 50, 110, 110])
    ends = np.array([70, 70, 120, 140, 150])
    # live sets: [30,40) {0}; [40,50) {0,1}; [50,70) {0,1,2}; [70,110) {2}; [110,120) {2,3,4}; ...
    assert memory_row_times(starts, ends).tolist() == [50, 110]


def test_cpsat_scale_keeps_distinct_costs_distinct() -> None:
    costs = np.array([0.001, 0.0015, 2.0, 2.0, 7.25])
    scale = objective_scale(costs)
    scaled = np.round(costs * scale)
    assert len(np.unique(scaled)) == len(np.unique(costs))
    assert np.all(np.diff(scaled[np.argsort(costs)]) >= 0)
    assert objective_scale(np.array([3.0, 5.0, math.inf])) == 1.0


def test_started_work_hands_back_its_value_or_its_error() -> None:
    program = build_program(compact(random_problem(np.random.default_rng(3))))
    started = Started(program, lambda: 41 + 1)
    assert started.result() == 42 and started.done() and started.program is program

    def fails() -> int:
        raise ValueError("no LP")

    with pytest.raises(ValueError, match="no LP"):
        Started(program, fails).result()


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_only_highs_begins_work_before_the_warm_start(backend: str) -> None:
    program = build_program(compact(random_problem(np.random.default_rng(4))))
    started = get_backend(backend).begin(program, time_limit=5, threads=2)
    assert (started is not None) == (backend == "highs")
    if started is not None:
        started.result()
