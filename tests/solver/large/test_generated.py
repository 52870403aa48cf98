"""Column generation over the promising strategies: the master LP's memory prices bound the whole problem at
the LP's level; answers fit and are never worse than the incumbent."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from solver.backends.base import OPTIMAL, BackendLimits
from solver.backends.highs import solve_mip
from solver.backends.highs_relaxation import solve_relaxation
from solver.bounds.lagrangian_branch import LagrangianBranch
from solver.compact import compact
from solver.evaluate import evaluate
from solver.ilp import binding_memory_times, build_program
from solver.large.generated import GenerationGoal, generate_and_solve
from solver.problem import Problem
from tests.solver.random_problems import brute_force, random_problem


def _tight_chain(
    rng: np.random.Generator, nodes: int | None = None, strategies: tuple[int, int] = (2, 5)
) -> Problem:
    """A chain of ``nodes`` (default 4-7) nodes (``strategies``: 2-4) whose memory terms overlap three at a
    time, the limit halfway between the least and the largest peak: the memory rows bind and the LP mixes
    placements."""
    n = int(rng.integers(4, 8)) if nodes is None else nodes
    counts = rng.integers(*strategies, size=n)
    usages = [rng.integers(1, 20, size=c) for c in counts]
    intervals = [[k, k + 3] for k in range(n)]
    least = max(sum(int(usages[j].min()) for j in range(max(0, t - 2), t + 1)) for t in range(n))
    largest = max(sum(int(usages[j].max()) for j in range(max(0, t - 2), t + 1)) for t in range(n))
    return Problem.from_lists(
        costs=[rng.integers(0, 50, size=c).astype(float) for c in counts],
        usages=usages,
        intervals=intervals,
        edges=[(k, k + 1) for k in range(n - 1)],
        edge_costs=[rng.integers(0, 30, size=(counts[k], counts[k + 1])).astype(float) for k in range(n - 1)],
        usage_limit=(least + largest) // 2,
    )


def test_the_master_lp_prices_bound_the_whole_problem_at_the_lp_value() -> None:
    # On a chain TRW-S is exact for any prices, so at the master LP's memory duals the Lagrangian bound is the
    # LP's value (LP duality) -- the duals reach the right rows in the right unit -- and with every strategy
    # in the master, the MIPs after it end at the optimum.
    rng = np.random.default_rng(5)
    checked = 0
    for case in range(20):
        problem = _tight_chain(rng)
        optimum, _ = brute_force(problem)
        core = compact(problem)
        if optimum is None or len(binding_memory_times(core)) == 0:
            continue
        search = LagrangianBranch(core)
        search.run(0.0, time.perf_counter() + 10.0, max_subproblems=1)
        everything = [np.arange(len(c), dtype=np.int64) for c in core.costs]
        goal = GenerationGoal(deadline=time.perf_counter() + 10.0)
        result = generate_and_solve(core, search, everything, None, -math.inf, goal)
        program = build_program(core, memory_times=binding_memory_times(core))
        relaxation = solve_relaxation(program, 10.0, 1)
        assert relaxation is not None
        assert result.bound == pytest.approx(relaxation.objective, rel=1e-6, abs=1e-6), case
        assert result.bound <= optimum + 1e-6
        assert result.cost == pytest.approx(optimum), case
        assert evaluate(problem, core.lift(result.assignment)).feasible
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("seed", range(2))
def test_bounds_hold_and_answers_fit_and_never_lose_the_incumbent(seed: int) -> None:
    rng = np.random.default_rng(70 + seed)
    answered = 0
    for case in range(40):
        problem = random_problem(rng, nodes=(3, 7), strategies=(2, 4), with_limit=True, forbidden_rate=0.05)
        optimum, _ = brute_force(problem)
        core = compact(problem)
        try:
            search = LagrangianBranch(core)
        except ValueError:  # no edge, or nothing feasible for TRW-S
            continue
        searched = search.run(0.01, time.perf_counter() + 10.0, max_subproblems=1)
        keep = search.promising_strategies()
        if searched.assignment is not None:
            chosen = searched.assignment.tolist()
            keep = [np.union1d(k, [s]).astype(np.int64) for k, s in zip(keep, chosen, strict=True)]
        goal = GenerationGoal(deadline=time.perf_counter() + 10.0, relative_gap=0.01)
        result = generate_and_solve(core, search, keep, searched.assignment, searched.bound, goal)
        if optimum is None:
            assert result.assignment is None
            continue
        assert result.bound <= optimum + 1e-6, case
        if result.assignment is None:
            continue
        evaluation = evaluate(problem, core.lift(result.assignment))
        assert evaluation.feasible, case
        assert evaluation.cost == pytest.approx(result.cost)
        assert optimum - 1e-6 <= result.cost <= searched.cost, case
        answered += 1
    assert answered >= 15


def test_a_mip_gives_up_once_its_bound_passes_what_it_looks_for() -> None:
    # `solve_mip`'s ``give_up`` (the support's MIP when a wider one follows): below the relaxation's value,
    # HiGHS stops at its root instead of proving its optimum; its bound is then past ``give_up``, still a
    # bound, and an answer it has kept is a whole one.
    stopped = 0
    for seed in range(5):
        problem = _tight_chain(np.random.default_rng(seed), nodes=30, strategies=(3, 6))
        core = compact(problem)
        program = build_program(core, memory_times=binding_memory_times(core))
        relaxation = solve_relaxation(program, 10.0, 1)
        assert relaxation is not None
        optimum = solve_mip(program, BackendLimits(10.0, 1))
        assert optimum.status == OPTIMAL
        give_up = relaxation.objective - 1.0
        result = solve_mip(program, BackendLimits(10.0, 1), give_up=give_up)
        assert give_up < result.bound <= optimum.objective + 1e-6, seed
        if result.assignment is not None:
            assert result.objective >= optimum.objective - 1e-6
            assert evaluate(problem, core.lift(result.assignment)).feasible
        stopped += result.status != OPTIMAL
    assert stopped >= 3
