"""The pruned solve: TRW-S beliefs pick strategies, the restricted program is solved; bound and answer."""

from __future__ import annotations

import math
import time

import numpy as np

from solver.compact import compact
from solver.evaluate import evaluate
from solver.large.pruned import pruned_solve, restrict
from solver.whole import BackendSettings, restricted_solver
from tests.solver.random_problems import brute_force, random_problem

_solver = restricted_solver(BackendSettings("highs", threads=1))


def test_restrict_cuts_costs_edges_and_usages_alike() -> None:
    rng = np.random.default_rng(3)
    problem = compact(random_problem(rng, nodes=(4, 4), strategies=(3, 3), with_limit=True))
    keep = [np.array([0, 2]), np.array([1]), np.array([0, 1, 2]), np.array([2])]
    small = restrict(problem, keep)
    assert small.strategy_counts.tolist() == [2, 1, 3, 1]
    for k in range(4):
        assert np.array_equal(small.costs[k], problem.costs[k][keep[k]])
    for e, (a, b) in enumerate(problem.edge_nodes.tolist()):
        assert np.array_equal(small.edge_costs[e], problem.edge_costs[e][np.ix_(keep[a], keep[b])])
    for t, k in enumerate(problem.term_node.tolist()):
        assert np.array_equal(small.term_usages[t], problem.term_usages[t][keep[k]])
    chosen = np.array([1, 0, 2, 0])  # restricted indices -> whole ones 2, 1, 2, 2
    assert small.cost(chosen) == problem.cost(np.array([2, 1, 2, 2]))


def test_answers_are_valid_and_the_bound_never_passes_the_optimum() -> None:
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(40):
        original = random_problem(rng, nodes=(3, 7), strategies=(2, 5), with_limit=False)
        expected, _ = brute_force(original)
        if expected is None:
            continue
        problem = compact(original)
        incumbent = None
        for keep in (1, 2, 100):
            now = time.perf_counter()
            result = pruned_solve(problem, incumbent, now + 2.0, now + 10.0, _solver, keep_per_node=keep)
            assert result.bound <= expected + 1e-6
            if result.assignment is None:
                continue
            cost = problem.cost(result.assignment)
            assert math.isfinite(cost) and cost >= expected - 1e-6
            assert evaluate(original, problem.lift(result.assignment)).feasible
            if keep == 100:  # nothing pruned: the restricted program is the whole one
                assert cost == expected
            incumbent = result.assignment
        checked += 1
    assert checked >= 20
