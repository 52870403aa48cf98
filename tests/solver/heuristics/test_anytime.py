"""The anytime heuristic against brute force on small random problems, and its contracts."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from solver.compact import CompactProblem, compact
from solver.evaluate import evaluate
from solver.heuristics.anytime import HeuristicRun, heuristic_solve, warm_up
from solver.heuristics.contract import contract
from solver.heuristics.kernels import seg_add, seg_build, seg_max
from solver.iopddl import load
from solver.problem import Problem
from tests.bundled_data import EXAMPLE

BUDGET = 0.1


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    warm_up()


def random_problem(
    rng: np.random.Generator, tree: bool = False, limit: bool = True, max_nodes: int = 6
) -> Problem:
    """4..max_nodes nodes, 1..3 strategies, edges with some forbidden pairs, intervals and a usage limit."""
    n = int(rng.integers(4, max_nodes + 1))
    counts = rng.integers(1, 4, n)
    costs = [rng.integers(0, 30, c).astype(float) for c in counts]
    for c in costs:
        if len(c) > 1 and rng.random() < 0.2:
            c[rng.integers(len(c))] = math.inf
    if tree:
        edges = [(int(rng.integers(0, i)), i) for i in range(1, n)]
    else:
        pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
        chosen = rng.choice(len(pairs), size=min(len(pairs), int(rng.integers(n - 1, 2 * n))), replace=False)
        edges = [pairs[i] for i in chosen]
    edge_costs = []
    for u, v in edges:
        matrix = rng.integers(0, 40, (counts[u], counts[v])).astype(float)
        matrix[rng.random(matrix.shape) < 0.25] = math.inf
        edge_costs.append(matrix)
    starts = rng.integers(0, 8, n)
    intervals = [[int(s), int(s + rng.integers(0, 6))] for s in starts]
    usages = [rng.integers(1, 10, c) for c in counts]
    usage_limit = int(rng.integers(8, 30)) if limit else None
    return Problem.from_lists(costs, usages, intervals, edges, edge_costs, usage_limit=usage_limit)


def brute_force(problem: Problem) -> float:
    """Optimal cost over every assignment (``inf`` when none is feasible)."""
    best = math.inf
    for choice in itertools.product(*[range(int(c)) for c in problem.strategy_counts]):
        evaluation = evaluate(problem, np.array(choice))
        if evaluation.feasible:
            best = min(best, evaluation.cost)
    return best


def solve(problem: Problem, **kwargs: object) -> tuple[CompactProblem, np.ndarray | None]:
    compact_problem = compact(problem)
    searches = int(kwargs.pop("searches", 1))  # type: ignore[call-overload]
    run = HeuristicRun(**kwargs)  # type: ignore[arg-type]
    return compact_problem, heuristic_solve(compact_problem, BUDGET, run, searches)


def test_example_reaches_its_optimum_445() -> None:
    problem = load(EXAMPLE)
    compact_problem, result = solve(problem)
    assert result is not None
    evaluation = evaluate(problem, compact_problem.lift(result))
    assert evaluation.feasible
    assert evaluation.cost == 445


@pytest.mark.parametrize("searches", [1, 2])
def test_random_problems_feasible_never_below_optimum_and_usually_optimal(searches: int) -> None:
    """One search, or two taking turns in the process (what one core runs)."""
    rng = np.random.default_rng(7)
    optimal = solved = 0
    for _ in range(25):
        problem = random_problem(rng)
        best = brute_force(problem)
        compact_problem, result = solve(problem, searches=searches)
        if math.isinf(best):
            assert result is None
            continue
        assert result is not None
        evaluation = evaluate(problem, compact_problem.lift(result))
        assert evaluation.feasible, evaluation.violations
        assert evaluation.cost >= best
        solved += 1
        optimal += evaluation.cost == best
    assert solved >= 10
    assert optimal >= solved - 1


def test_trees_without_memory_limit_are_solved_exactly() -> None:
    rng = np.random.default_rng(11)
    for _ in range(15):
        problem = random_problem(rng, tree=True, limit=False, max_nodes=7)
        best = brute_force(problem)
        compact_problem, result = solve(problem)
        if math.isinf(best):
            assert result is None
            continue
        assert result is not None
        assert evaluate(problem, compact_problem.lift(result)).cost == best


def test_memory_infeasible_problem_returns_none() -> None:
    problem = Problem.from_lists(
        costs=[[1.0, 2.0], [1.0]], usages=[[5, 4], [3]], intervals=[[0, 4], [2, 6]], usage_limit=6
    )
    assert solve(problem)[1] is None


def test_forbidden_everywhere_returns_none() -> None:
    problem = Problem.from_lists(
        costs=[[1.0, 2.0], [1.0, 1.0]],
        edges=[[0, 1]],
        edge_costs=[[[math.inf, math.inf], [math.inf, math.inf]]],
    )
    assert solve(problem)[1] is None


def test_limit_forces_a_more_expensive_choice() -> None:
    problem = Problem.from_lists(
        costs=[[0.0, 10.0], [0.0, 3.0]],
        usages=[[6, 1], [6, 2]],
        intervals=[[0, 3], [1, 4]],
        edges=[[0, 1]],
        edge_costs=[[[0.0, 1.0], [1.0, 0.0]]],
        usage_limit=8,
    )
    compact_problem, result = solve(problem)
    assert result is not None
    evaluation = evaluate(problem, compact_problem.lift(result))
    assert evaluation.feasible
    assert evaluation.cost == brute_force(problem) == 4.0


def test_groups_and_pins_are_respected() -> None:
    rng = np.random.default_rng(3)
    base = random_problem(rng, limit=False)
    counts = base.strategy_counts
    same = [i for i in range(base.num_nodes) if counts[i] == counts[0]]
    problem = base.replace(groups=(tuple(same[:2]),), pins={base.num_nodes - 1: 0})
    compact_problem, result = solve(problem)
    best = brute_force(problem)
    if math.isinf(best):
        assert result is None
        return
    assert result is not None
    evaluation = evaluate(problem, compact_problem.lift(result))
    assert evaluation.feasible, evaluation.violations
    assert evaluation.cost == best


def test_incumbents_improve_and_match_the_evaluator() -> None:
    problem = random_problem(np.random.default_rng(5), max_nodes=8)
    reported: list[tuple[float, np.ndarray]] = []
    compact_problem, result = solve(problem, on_incumbent=lambda cost, a: reported.append((cost, a)))
    if result is None:
        assert not reported
        return
    costs = [cost for cost, _ in reported]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    for cost, assignment in reported:
        assert evaluate(problem, compact_problem.lift(assignment)).cost == cost
    assert np.array_equal(reported[-1][1], result)


def test_same_seed_same_answer_and_stop_returns_early() -> None:
    problem = load(EXAMPLE)
    compact_problem = compact(problem)
    first = heuristic_solve(compact_problem, BUDGET, HeuristicRun(seed=4))
    second = heuristic_solve(compact_problem, BUDGET, HeuristicRun(seed=4))
    assert first is not None and second is not None and np.array_equal(first, second)
    first = heuristic_solve(compact_problem, BUDGET, HeuristicRun(seed=4), searches=2)
    second = heuristic_solve(compact_problem, BUDGET, HeuristicRun(seed=4), searches=2)
    assert first is not None and second is not None and np.array_equal(first, second)
    stopped = heuristic_solve(compact_problem, 60.0, HeuristicRun(stop=lambda: True))
    assert stopped is not None
    assert evaluate(problem, compact_problem.lift(stopped)).feasible


def test_initial_assignment_is_kept_when_it_is_the_optimum() -> None:
    problem = load(EXAMPLE)
    compact_problem = compact(problem)
    optimum = np.array([0, 0, 2, 1, 0])
    reported: list[float] = []
    run = HeuristicRun(initial=optimum, on_incumbent=lambda cost, _: reported.append(cost))
    heuristic_solve(compact_problem, BUDGET, run)
    assert reported == [445.0]


def test_contraction_is_exact() -> None:
    rng = np.random.default_rng(2)
    for _ in range(20):
        compact_problem = compact(random_problem(rng, limit=False, max_nodes=8))
        contraction = contract(compact_problem)
        if contraction is None:
            continue
        small = contraction.problem
        assert small.num_nodes <= compact_problem.num_nodes
        for _ in range(5):
            choice = np.array([rng.integers(0, c) for c in small.strategy_counts], dtype=np.int64)
            expanded = contraction.expand(choice)
            assert small.cost(choice) == compact_problem.cost(expanded)
            assert np.array_equal(contraction.expand(contraction.restrict(expanded)), expanded)


def test_segment_tree_range_add_and_max_match_a_plain_array() -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 100, 13)
    t, d = seg_build(values, 16)
    for _ in range(300):
        lo = int(rng.integers(0, 13))
        hi = int(rng.integers(lo + 1, 14))
        if rng.random() < 0.5:
            delta = int(rng.integers(-20, 21))
            seg_add(t, d, 16, lo, hi, delta)
            values[lo:hi] += delta
        else:
            assert seg_max(t, d, 16, lo, hi) == values[lo:hi].max()
        assert t[1] == values.max()
