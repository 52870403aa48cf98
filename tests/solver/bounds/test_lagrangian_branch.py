"""Lagrangian branch-and-bound over TRW-S: valid bounds, answers that fit, branching that closes gaps."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver.bounds.lagrangian_branch import LagrangianBranch
from solver.compact import compact
from solver.evaluate import evaluate
from solver.problem import Problem
from solver.solve import SolveOptions, solve
from tests.solver.random_problems import brute_force, random_problem


def _search(problem: Problem, relative_gap: float = 0.0):
    core = compact(problem)
    try:
        search = LagrangianBranch(core)
    except ValueError:
        return core, None, None
    return core, search, search.run(relative_gap, time.perf_counter() + 10.0)


@pytest.mark.parametrize("seed", range(3))
def test_bounds_hold_and_answers_fit_on_random_memory_limited_problems(seed: int) -> None:
    rng = np.random.default_rng(40 + seed)
    closed = 0
    for _ in range(120):
        problem = random_problem(rng, nodes=(3, 7), strategies=(2, 4), with_limit=True, forbidden_rate=0.05)
        optimum, _ = brute_force(problem)
        core, _search_state, result = _search(problem)
        if result is None:
            continue
        if optimum is None:
            assert result.assignment is None
            continue
        assert result.bound <= optimum + 1e-6
        if result.assignment is not None:
            evaluation = evaluate(problem, core.lift(result.assignment))
            assert evaluation.feasible
            assert evaluation.cost == pytest.approx(result.cost)
            assert result.cost >= optimum - 1e-6
            if result.within(0.0):
                closed += 1
                assert result.cost == pytest.approx(optimum, abs=1e-6)
    assert closed >= 30  # the search proves a good share of them optimal on its own


def _knapsack_chain(weights: list[list[int]], costs: list[list[float]], limit: int) -> Problem:
    """Nodes in a chain (free edges), every usage live at one common step: a multiple-choice knapsack."""
    n = len(costs)
    return Problem.from_lists(
        costs=costs,
        usages=weights,
        intervals=[[0, 2]] * n,
        edges=[(k, k + 1) for k in range(n - 1)],
        edge_costs=[np.zeros((len(costs[k]), len(costs[k + 1]))) for k in range(n - 1)],
        usage_limit=limit,
    )


def test_branching_on_usage_closes_a_gap_the_root_leaves() -> None:
    # Three nodes, each cheap-and-heavy or dear-and-light (two equal light copies, so that forbidding one
    # strategy alone would not move the bound); the limit allows one heavy node and most of a second. The
    # root's Lagrangian mixes (bound below the optimum); branching on usage proves the optimum.
    costs = [[0.0, 10.0, 10.0], [0.0, 11.0, 11.0], [0.0, 12.0, 12.0]]
    weights = [[10, 1, 1], [10, 1, 1], [10, 1, 1]]
    problem = _knapsack_chain(weights, costs, limit=16)
    optimum, _ = brute_force(problem)
    assert optimum == 21.0
    _core, search, result = _search(problem)
    assert search is not None and result is not None
    root = search.evaluate(search.root(), math.inf, time.perf_counter() + 10.0)
    assert root.bound < optimum - 4.0  # the Lagrangian at the root: ~16.1
    assert result.subproblems > 1
    assert result.within(0.0)
    assert result.cost == pytest.approx(optimum)


def test_the_search_stops_at_its_root_where_memory_prices_make_enough_of_the_bound() -> None:
    # The knapsack above: the root's prices lift the memory-free bound (0) to ~16, all of it memory's price.
    costs = [[0.0, 10.0, 10.0], [0.0, 11.0, 11.0], [0.0, 12.0, 12.0]]
    weights = [[10, 1, 1], [10, 1, 1], [10, 1, 1]]
    problem = _knapsack_chain(weights, costs, limit=16)
    _core, search, result = _search(problem)  # branches to the optimum (the test above)
    assert search is not None and result is not None and result.subproblems > 1
    assert search.memory_free_bound == pytest.approx(0.0, abs=1e-6)
    assert search.memory_price_share == pytest.approx(1.0, rel=1e-6)
    rooted = LagrangianBranch(compact(problem))
    stopped = rooted.run(0.0, time.perf_counter() + 10.0, root_only_share=0.5)
    assert stopped.subproblems == 1 and not stopped.within(0.0)
    assert rooted.run(0.0, time.perf_counter() + 10.0, root_only_share=1.5).subproblems > 1


def test_promising_strategies_hold_an_optimum_of_a_tree() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(3, 8))
        counts = rng.integers(2, 5, size=n)
        costs = [rng.integers(0, 50, size=c).astype(float) for c in counts]
        edges = [(int(rng.integers(0, v)), v) for v in range(1, n)]
        matrices = [rng.integers(0, 40, size=(counts[a], counts[b])).astype(float) for a, b in edges]
        usages = [np.zeros(c, dtype=np.int64) for c in counts]
        problem = Problem.from_lists(
            costs=costs,
            usages=usages,
            intervals=[[0, 1]] * n,
            edges=edges,
            edge_costs=matrices,
            usage_limit=10,
        )
        optimum, _ = brute_force(problem)
        core, search, result = _search(problem)
        assert search is not None and result is not None
        keep = search.promising_strategies()
        best = min(
            (
                core.cost(np.array(choice))
                for choice in np.array(np.meshgrid(*keep, indexing="ij")).reshape(n, -1).T.tolist()
            ),
            default=math.inf,
        )
        assert best == pytest.approx(optimum)


def test_solve_closes_memory_limited_problems_through_the_search() -> None:
    # The knapsack above on top of a large fixed cost (a root gap of a few percent: the search is worth
    # it), with edges that survive the reductions (switching placements costs a little).
    costs = [[300.0, 310.0, 310.5], [300.0, 311.0, 311.5], [300.0, 312.0, 312.5]]
    weights = [[10, 1, 2], [10, 1, 2], [10, 1, 2]]
    problem = _knapsack_chain(weights, costs, limit=16)
    problem = problem.replace(edge_costs=np.concatenate([np.ones((3, 3)) - np.eye(3)] * 2).ravel())
    optimum, _ = brute_force(problem)
    result = solve(problem, SolveOptions(backend="highs", time_limit=20.0, relative_gap=0.01))
    assert result.backend == "lagrangian"
    assert "lagrangian" in result.timings and "heuristic" not in result.timings
    assert result.cost <= optimum * 1.01
    assert result.bound <= optimum + 1e-9
    assert result.gap is not None and result.gap <= 0.01
