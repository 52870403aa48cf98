"""Large neighbourhood search: never worse, always feasible, and it reaches the optimum on small problems."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solver.compact import compact
from solver.evaluate import evaluate
from solver.heuristics.state import flatten, min_usage_assignment
from solver.large.lns import lns_improve
from solver.large.regions import fixed_outside
from tests.solver.random_problems import brute_force, random_problem


def test_region_covering_everything_finds_the_optimum() -> None:
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(60):
        problem = random_problem(rng, nodes=(3, 6), forbidden_rate=0.0, groups=False, pins=False)
        expected, _ = brute_force(problem)
        if expected is None:
            continue
        core = compact(problem)
        start = min_usage_assignment(flatten(core))
        if not evaluate(problem, core.lift(start)).feasible:
            continue
        best, stats = lns_improve(core, start, time.perf_counter() + 3, region_nodes=core.num_nodes)
        evaluation = evaluate(problem, core.lift(best))
        assert evaluation.feasible
        assert evaluation.cost <= evaluate(problem, core.lift(start)).cost
        assert evaluation.cost == expected, (evaluation.cost, expected, stats)
        checked += 1
    assert checked >= 20


def test_subproblem_keeps_the_cost_of_the_fixed_part_out_and_the_memory_in() -> None:
    rng = np.random.default_rng(9)
    problem = random_problem(rng, nodes=(6, 6), strategies=(2, 3), with_limit=True, forbidden_rate=0.0)
    core = compact(problem)
    assignment = np.zeros(core.num_nodes, dtype=np.int64)
    region = np.array([0, 2], dtype=np.int64)
    sub, warm = fixed_outside(core, region, assignment)
    assert sub.num_nodes == len(region) + 1
    assert warm.tolist() == [0, 0, 0]
    # every memory term is kept: the region's as variables, the rest as constants on the background node
    assert len(sub.term_node) == len(core.term_node)
    assert all(len(sub.term_usages[t]) == 1 for t in np.flatnonzero(sub.term_node == len(region)))


def test_solve_falls_back_to_lns_when_the_program_is_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    import solver.policy as policy
    import solver.solve as pipeline

    monkeypatch.setattr(policy, "FULL_PROGRAM_MAX_VARIABLES", -1)
    rng = np.random.default_rng(21)
    for _ in range(10):
        problem = random_problem(rng, nodes=(4, 7), with_limit=False, forbidden_rate=0.0)
        expected, _ = brute_force(problem)
        result = pipeline.solve(problem, pipeline.SolveOptions(backend="highs", time_limit=2, threads=1))
        assert result.backend == "highs (lns)"
        assert result.variables == 0
        assert evaluate(problem, result.solution).feasible
        assert result.cost >= expected
        assert result.bound <= expected
