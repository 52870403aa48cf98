"""The TRW-S dual bound: never above the memory-free optimum, exact on trees, never below the trivial one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solver.bounds.memory_priced import memory_dual_bound
from solver.bounds.trws import dual_bound
from solver.compact import compact
from solver.problem import Problem
from tests.solver.random_problems import brute_force, random_problem


def _random_tree(rng: np.random.Generator) -> Problem:
    n = int(rng.integers(1, 9))
    counts = rng.integers(1, 5, size=n)
    costs = [rng.integers(0, 50, size=c).astype(float) for c in counts]
    for c in costs:
        c[rng.random(len(c)) < 0.1] = np.inf
    edges, matrices = [], []
    for v in range(1, n):
        u = int(rng.integers(0, v))
        a, b = (u, v) if rng.random() < 0.5 else (v, u)
        matrix = rng.integers(0, 40, size=(counts[a], counts[b])).astype(float)
        matrix[rng.random(matrix.shape) < 0.15] = np.inf
        edges.append((a, b))
        matrices.append(matrix)
    return Problem.from_lists(costs=costs, edges=edges, edge_costs=matrices)


@pytest.mark.parametrize("seed", range(3))
def test_bound_is_valid_and_beats_trivial(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(100):
        problem = random_problem(rng, nodes=(2, 7), strategies=(1, 4), groups=True, pins=True)
        problem = problem.replace(usage_limit=None)
        optimum, _ = brute_force(problem)
        core = compact(problem)
        bound = dual_bound(core, time_limit=0.5)
        assert bound <= (math.inf if optimum is None else optimum + 1e-6)
        assert bound >= core.trivial_bound() - 1e-9


def test_bound_is_exact_on_trees() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        problem = _random_tree(rng)
        optimum, _ = brute_force(problem)
        bound = dual_bound(compact(problem), time_limit=0.5)
        if optimum is None:
            assert bound == math.inf  # arc consistency is complete on trees
        else:
            assert bound == pytest.approx(optimum, abs=1e-6)
            assert bound <= optimum


def test_bound_is_exact_on_a_chain_with_large_costs() -> None:
    rng = np.random.default_rng(3)
    n, s = 30, 6
    costs = [rng.integers(0, 10**12, size=s).astype(float) for _ in range(n)]
    edges = [(i, i + 1) for i in range(n - 1)]
    matrices = [rng.integers(0, 10**12, size=(s, s)).astype(float) for _ in edges]
    problem = Problem.from_lists(costs=costs, edges=edges, edge_costs=matrices)
    # Dynamic programming along the chain.
    best = costs[0].copy()
    for i, matrix in enumerate(matrices):
        best = (best[:, None] + matrix).min(axis=0) + costs[i + 1]
    optimum = float(best.min())
    bound = dual_bound(compact(problem), time_limit=1.0)
    assert bound <= optimum
    assert bound >= optimum * (1 - 1e-9)


def test_no_edges_and_time_limit_zero() -> None:
    problem = Problem.from_lists(costs=[[3.0, 1.0], [np.inf, 2.0]])
    assert dual_bound(compact(problem), time_limit=0.0) == pytest.approx(3.0)
    rng = np.random.default_rng(11)
    problem = random_problem(rng, nodes=(5, 6), strategies=(2, 3)).replace(usage_limit=None)
    core = compact(problem)
    assert dual_bound(core, time_limit=0.0) >= core.trivial_bound() - 1e-9


# ------------------------------------------------------------------------------------ memory dualised
def _warm_kernels() -> None:
    """Compile (or load) every kernel once, so that the short time limits below are spent ascending."""
    rng = np.random.default_rng(99)
    for _ in range(3):
        problem = random_problem(rng, nodes=(5, 6), strategies=(2, 3), with_limit=True)
        memory_dual_bound(compact(problem), time_limit=5.0)


@pytest.mark.parametrize("with_upper_bound", [False, True])
def test_memory_bound_is_valid_and_beats_the_memory_free_one(with_upper_bound: bool) -> None:
    _warm_kernels()
    rng = np.random.default_rng(5 + with_upper_bound)
    binding = tighter = 0
    for _ in range(300):
        problem = random_problem(
            rng, nodes=(2, 7), strategies=(1, 4), with_limit=True, groups=True, pins=True
        )
        optimum, _ = brute_force(problem)
        core = compact(problem)
        upper = optimum if with_upper_bound else None
        bound = memory_dual_bound(core, time_limit=0.2, upper_bound=upper)
        if optimum is None:
            continue  # any value is a lower bound on an infeasible problem
        assert bound <= optimum + 1e-6
        free = dual_bound(core, time_limit=0.2)
        assert bound >= free - 1e-9 * (1.0 + abs(free))  # never below the memory-free bound
        if optimum > free + 1e-6:
            binding += 1
            tighter += bound > free + 1e-6
    assert binding >= 5
    assert tighter >= 0.8 * binding


def test_memory_bound_without_limit_or_edges() -> None:
    _warm_kernels()
    rng = np.random.default_rng(13)
    problem = random_problem(rng, nodes=(4, 5), strategies=(2, 3)).replace(usage_limit=None)
    core = compact(problem)
    assert memory_dual_bound(core, time_limit=0.2) == pytest.approx(dual_bound(core, time_limit=0.2))
    # No edges: the bound is the exact Lagrangian dual of independent nodes; a tight limit binds.
    problem = Problem.from_lists(
        costs=[[0.0, 10.0], [0.0, 10.0]],
        usages=[[5, 1], [5, 1]],
        intervals=[[0, 2], [1, 3]],
        usage_limit=6,
    )
    optimum, _ = brute_force(problem)
    assert optimum == 10.0
    bound = memory_dual_bound(compact(problem), time_limit=0.5)
    assert 0.0 < bound <= optimum
    # The minimum usages alone exceed the limit: proven infeasible.
    assert memory_dual_bound(compact(problem.replace(usage_limit=1)), time_limit=0.5) == math.inf
