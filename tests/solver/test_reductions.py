"""Reductions keep the optimum: brute force on random small problems, plus one test per reduction."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from solver import reductions
from solver.compact import compact
from solver.errors import InfeasibleError
from solver.evaluate import evaluate
from solver.problem import Problem
from solver.reductions import (
    ALL_REDUCTIONS,
    DOMINATED,
    FOLD,
    FOLLOW,
    FORBIDDEN,
    GROUP_EDGES,
    PARALLEL,
    PINS,
    Reduced,
    reduce,
)
from tests.bundled_data import INSTANCE_G
from tests.solver import random_problems
from tests.solver.random_problems import beaten_by_definition

INF = math.inf


# --------------------------------------------------------------------------- random problems
def _random_matrix(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Small integers (ties are common), some forbidden entries, sometimes a permutation ("follow")."""
    if rows == cols > 1 and rng.random() < 0.3:
        matrix = np.full((rows, cols), INF)
        matrix[np.arange(rows), rng.permutation(cols)] = rng.integers(0, 4, rows)
        return matrix
    matrix = rng.integers(0, 4, (rows, cols)).astype(float)
    matrix[rng.random((rows, cols)) < 0.15] = INF
    return matrix


def _random_edges(rng: np.random.Generator, counts: np.ndarray) -> tuple[list[list[int]], list[np.ndarray]]:
    n = len(counts)
    edges: list[list[int]] = []
    for _ in range(int(rng.integers(0, 2 * n))):
        if edges and rng.random() < 0.2:
            u, v = edges[int(rng.integers(len(edges)))]
            u, v = (v, u) if rng.random() < 0.5 else (u, v)  # a parallel edge, maybe reversed
        else:
            u, v = (int(x) for x in rng.choice(n, 2, replace=False))
        edges.append([u, v])
    matrices = [_random_matrix(rng, int(counts[u]), int(counts[v])) for u, v in edges]
    return edges, matrices


def _copy_strategy(
    rng: np.random.Generator,
    costs: list[np.ndarray],
    usages: list[np.ndarray],
    edges: list[list[int]],
    matrices: list[np.ndarray],
) -> None:
    """Make strategy 1 of a node a (sometimes slightly worse) copy of strategy 0: dominance to find."""
    candidates = [i for i, c in enumerate(costs) if len(c) > 1]
    if not candidates:
        return
    node = candidates[int(rng.integers(len(candidates)))]
    costs[node][1] = costs[node][0] + rng.integers(0, 2)
    usages[node][1] = usages[node][0]
    for (u, v), matrix in zip(edges, matrices, strict=True):
        if u == node:
            matrix[1, :] = matrix[0, :]
        if v == node:
            matrix[:, 1] = matrix[:, 0]


def random_problem(rng: np.random.Generator) -> Problem:
    """3-7 nodes, 1-4 strategies, parallel edges, inf entries, empty intervals, groups, pins, limits."""
    n = int(rng.integers(3, 8))
    counts = rng.integers(1, 5, n)
    groups: list[list[int]] = []
    if rng.random() < 0.35:
        members = [int(x) for x in rng.choice(n, int(rng.integers(2, 4)), replace=False)]
        counts[members] = counts[members[0]]
        groups.append(members)
    costs = [rng.integers(0, 6, c).astype(float) for c in counts]
    for c in costs:
        c[rng.random(len(c)) < 0.1] = INF
    usages = [rng.integers(0, 5, c) for c in counts]
    starts = rng.integers(0, 4, n)
    intervals = np.stack([starts, starts + rng.integers(0, 3, n)], axis=1)  # length 0: never alive
    edges, matrices = _random_edges(rng, counts)
    if rng.random() < 0.5:
        _copy_strategy(rng, costs, usages, edges, matrices)
    limit = None if rng.random() < 0.4 else int(rng.integers(0, 4 * n))
    pins = {}
    if rng.random() < 0.25:
        node = int(rng.integers(n))
        pins[node] = int(rng.integers(counts[node]))
    return Problem.from_lists(
        costs=costs,
        usages=usages,
        intervals=intervals.tolist(),
        edges=edges,
        edge_costs=matrices,
        usage_limit=limit,
        groups=groups,
        pins=pins,
    )


# --------------------------------------------------------------------------- brute force
def all_assignments(problem: Problem) -> np.ndarray:
    """Every assignment, one per row."""
    ranges = [range(int(c)) for c in problem.strategy_counts]
    return np.array(list(itertools.product(*ranges)), dtype=np.int64).reshape(-1, problem.num_nodes)


def costs_and_feasibility(
    problem: Problem, assignments: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cost, peak usage, feasible) of every row, vectorised, with the evaluator's semantics."""
    offsets, counts = problem.node_offsets, problem.strategy_counts
    cost = problem.costs[offsets[:-1] + assignments].sum(axis=1)
    for e, (u, v) in enumerate(problem.edge_nodes.tolist()):
        cost = (
            cost
            + problem.edge_costs[problem.edge_offsets[e] + assignments[:, u] * counts[v] + assignments[:, v]]
        )
    used = problem.usages[offsets[:-1] + assignments]
    starts, ends = problem.intervals[:, 0], problem.intervals[:, 1]
    peak = np.zeros(len(assignments), dtype=np.int64)
    for t in np.unique(starts[ends > starts]):
        alive = (starts <= t) & (t < ends)
        peak = np.maximum(peak, used[:, alive].sum(axis=1))
    feasible = np.isfinite(cost)
    if problem.usage_limit is not None:
        feasible &= peak <= problem.usage_limit
    for members in problem.groups:
        feasible &= (assignments[:, list(members)] == assignments[:, [members[0]]]).all(axis=1)
    for node, strategy in problem.pins.items():
        feasible &= assignments[:, node] == strategy
    return cost, peak, feasible


def optimum(problem: Problem) -> float | None:
    """The brute-force optimum, ``None`` when infeasible."""
    cost, _, feasible = costs_and_feasibility(problem, all_assignments(problem))
    return float(cost[feasible].min()) if feasible.any() else None


def check_reduction(problem: Problem, enabled: tuple[str, ...] | None) -> None:
    """The invariant every reduction must keep (see solver.reductions)."""
    try:
        reduced = reduce(problem, enabled=enabled)
    except InfeasibleError:
        assert optimum(problem) is None, f"{enabled}: reported infeasible, but a solution exists"
        return
    small = reduced.problem
    assert small.num_nodes == problem.num_nodes
    assert [len(k) for k in reduced.kept] == small.strategy_counts.tolist()
    every = all_assignments(small)
    lifted = np.array([reduced.lift(r) for r in every])
    cost, peak, feasible = costs_and_feasibility(small, every)
    cost_back, peak_back, feasible_back = costs_and_feasibility(problem, lifted)
    assert np.array_equal(peak, peak_back), f"{enabled}: memory changed"
    assert feasible_back[feasible].all(), f"{enabled}: a reduced solution lifts to an infeasible one"
    assert np.array_equal(cost[feasible] + reduced.constant, cost_back[feasible]), f"{enabled}: cost changed"
    for r, original in zip(every[:20], lifted[:20], strict=True):
        assert np.array_equal(reduced.project(original), r)
    best, best_reduced = optimum(problem), optimum(small)
    if best is None:
        assert best_reduced is None, f"{enabled}: reduced problem feasible, original not"
    else:
        assert best_reduced is not None, f"{enabled}: optimum lost"
        assert best_reduced + reduced.constant == best, f"{enabled}: optimum changed"
        r = every[feasible][np.argmin(cost[feasible])]
        assert evaluate(problem, reduced.lift(r)).cost == evaluate(small, r).cost + reduced.constant
        assert evaluate(problem, reduced.lift(r)).feasible


CONFIGS: list[tuple[str, ...] | None] = [None, *[(name,) for name in ALL_REDUCTIONS]]


@pytest.mark.parametrize("enabled", CONFIGS, ids=lambda c: "all" if c is None else c[0])
def test_reductions_keep_optimum_on_random_problems(enabled: tuple[str, ...] | None) -> None:
    rng = np.random.default_rng(2025 + CONFIGS.index(enabled))
    for _ in range(300):
        check_reduction(random_problem(rng), enabled)


def test_brute_force_helper_agrees_with_evaluator() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        problem = random_problem(rng)
        every = all_assignments(problem)
        cost, peak, feasible = costs_and_feasibility(problem, every)
        for i in rng.integers(0, len(every), 5):
            report = evaluate(problem, every[i])
            assert report.cost == cost[i] and report.peak_usage == peak[i] and report.feasible == feasible[i]


def test_random_problems_exercise_every_reduction() -> None:
    rng = np.random.default_rng(11)
    totals = dict.fromkeys(ALL_REDUCTIONS, 0)
    for _ in range(200):
        try:
            reduced = reduce(random_problem(rng))
        except InfeasibleError:
            continue
        for step in reduced.steps:
            totals[step.name] += step.strategies_removed + step.edges_removed + step.nodes_merged
    assert all(count > 0 for count in totals.values()), totals


# --------------------------------------------------------------------------- the fast paths change nothing
def _plain_dominated(work: reductions._Work, tally: reductions._Tally) -> None:
    """The dominated reduction written plainly: every changed group again, a fresh feature matrix, and the
    pairwise definition of "beaten"."""
    heads = reductions._heads(work, work.changed_since(tally.last_tick))
    tally.last_tick = work.tick
    for head in heads:
        group = work.group(head)
        if work.count(head) < 2 or any(member in work.pins for member in group):
            continue
        cost = np.zeros(work.count(head))
        columns = []
        for member in group:
            cost = cost + work.costs[member]
            if work.has_limit and work.alive[member]:
                columns.append(work.usages[member].astype(float)[:, None])
            for e in work.incident[member]:
                if work.group_of[work.other(e, member)] != head:
                    columns.append(work.oriented(e, member))
                elif work.eu[e] == member:
                    cost = cost + np.diagonal(work.mats[e])
        removed = beaten_by_definition(np.hstack([cost[:, None], *columns]))
        if removed.any():
            tally.strategies += work.restrict_group(head, ~removed)


def _reduce_or_error(problem: Problem, enabled: tuple[str, ...] | None) -> Reduced | str:
    try:
        return reduce(problem, enabled=enabled)
    except InfeasibleError as error:
        return str(error)


def _assert_same(fast: Reduced | str, plain: Reduced | str) -> None:
    if isinstance(fast, str) or isinstance(plain, str):
        assert fast == plain
        return
    assert [k.tolist() for k in fast.kept] == [k.tolist() for k in plain.kept]
    assert fast.constant == plain.constant
    for name in ("node_offsets", "costs", "usages", "intervals", "edge_nodes", "edge_offsets", "edge_costs"):
        assert np.array_equal(getattr(fast.problem, name), getattr(plain.problem, name)), name
    assert fast.problem.groups == plain.problem.groups and fast.problem.pins == plain.problem.pins
    assert [s.strategies_removed for s in fast.steps] == [s.strategies_removed for s in plain.steps]


def _problems() -> list[Problem]:
    rng = np.random.default_rng(17)
    problems = [random_problem(rng) for _ in range(150)]
    for case in range(150):
        problems.append(
            random_problems.random_problem(
                rng, nodes=(2, 8), strategies=(1, 5), groups=case % 2 == 0, pins=case % 5 == 0
            )
        )
    problems += [random_problems.large_problem(rng, nodes=60, strategies=(2, 70)) for _ in range(3)]
    return problems


@pytest.mark.parametrize("enabled", [None, (DOMINATED,), (PINS, FORBIDDEN, FOLD, DOMINATED)], ids=str)
def test_reduce_equals_the_plain_dominated_reduction(
    monkeypatch: pytest.MonkeyPatch, enabled: tuple[str, ...] | None
) -> None:
    problems = _problems()
    fast = [_reduce_or_error(problem, enabled) for problem in problems]
    plain_pass = tuple(
        (name, _plain_dominated if name == DOMINATED else step) for name, step in reductions._PASS
    )
    monkeypatch.setattr(reductions, "_PASS", plain_pass)
    plain = [_reduce_or_error(problem, enabled) for problem in problems]
    assert sum(isinstance(r, Reduced) and r.steps[-1].strategies_removed > 0 for r in fast) > 50
    for case, (one, other) in enumerate(zip(fast, plain, strict=True)):
        try:
            _assert_same(one, other)
        except AssertionError as error:
            raise AssertionError(f"problem {case}: {error}") from error


# --------------------------------------------------------------------------- one reduction at a time
def test_forbidden_removes_inf_costs_and_all_inf_rows() -> None:
    problem = Problem.from_lists(
        costs=[[1, INF, 2], [0, 0]], edges=[[0, 1]], edge_costs=[[[INF, INF], [1, 1], [3, 4]]]
    )
    reduced = reduce(problem, enabled=[FORBIDDEN])
    assert reduced.kept[0].tolist() == [2]
    assert reduced.steps[0].name == FORBIDDEN and reduced.steps[0].strategies_removed == 2


def test_forbidden_everything_names_the_node() -> None:
    problem = Problem.from_lists(costs=[[1, 1], [INF, 2], [0]], edges=[[1, 2]], edge_costs=[[[0], [INF]]])
    with pytest.raises(InfeasibleError, match="every strategy of node 1 is forbidden"):
        reduce(problem)


def test_pins_restrict_the_whole_group_and_disappear() -> None:
    problem = Problem.from_lists(costs=[[1, 2, 3], [4, 5, 6], [0, 1]], groups=[[0, 1]], pins={1: 2})
    reduced = reduce(problem, enabled=[PINS])
    assert [k.tolist() for k in reduced.kept] == [[2], [2], [0, 1]]
    assert not reduced.problem.pins
    assert reduced.steps[0].strategies_removed == 4


def test_conflicting_pins_in_a_group_are_infeasible() -> None:
    problem = Problem.from_lists(costs=[[1, 2], [3, 4]], groups=[[0, 1]], pins={0: 0, 1: 1})
    with pytest.raises(InfeasibleError):
        reduce(problem, enabled=[PINS])


def test_single_strategy_fold_isolates_the_node() -> None:
    problem = Problem.from_lists(costs=[[5], [1, 2]], edges=[[0, 1]], edge_costs=[[[10, 20]]])
    reduced = reduce(problem, enabled=[FOLD])
    assert reduced.problem.num_edges == 0
    assert reduced.constant == 5
    assert reduced.problem.node_costs(1).tolist() == [11, 22]


def test_parallel_edges_are_summed_with_transpose() -> None:
    problem = Problem.from_lists(
        costs=[[0, 0], [0, 0, 0], [0, 0]],
        edges=[[0, 1], [1, 0], [0, 2], [2, 0]],
        edge_costs=[
            [[1, 2, 3], [4, 5, 6]],
            [[10, 20], [30, 40], [50, 60]],
            [[1, 2], [3, 4]],
            [[10, 20], [30, 40]],
        ],
    )
    reduced = reduce(problem, enabled=[PARALLEL])
    assert reduced.problem.edge_nodes.tolist() == [[0, 1], [0, 2]]
    assert reduced.problem.edge_matrix(0).tolist() == [[11, 32, 53], [24, 45, 66]]
    assert reduced.problem.edge_matrix(1).tolist() == [[11, 32], [23, 44]]
    assert reduced.steps[0].edges_removed == 2


def test_group_edge_becomes_its_diagonal() -> None:
    problem = Problem.from_lists(
        costs=[[0, 0], [1, 1]], edges=[[0, 1]], edge_costs=[[[3, 9], [9, 4]]], groups=[[0, 1]]
    )
    reduced = reduce(problem, enabled=[GROUP_EDGES])
    assert reduced.problem.num_edges == 0
    assert reduced.problem.node_costs(0).tolist() == [3, 4]


def test_follow_chain_collapses_to_one_super_node() -> None:
    swap = [[INF, 1], [2, INF]]
    problem = Problem.from_lists(
        costs=[[0, 5], [1, 1], [3, 0], [0, 0]],
        edges=[[0, 1], [1, 2], [2, 3]],
        edge_costs=[swap, swap, [[0, INF], [INF, 7]]],
    )
    reduced = reduce(problem, enabled=[FOLLOW])
    assert reduced.problem.num_edges == 0
    assert len(reduced.problem.groups) == 1 and len(reduced.problem.groups[0]) == 4
    assert compact(reduced.problem).num_nodes == 1
    assert reduced.steps[0].nodes_merged == 3
    assert optimum(reduced.problem) == optimum(problem)


def test_dominated_keeps_the_lower_index_on_ties() -> None:
    problem = Problem.from_lists(
        costs=[[2, 1, 1, 3], [0, 0]], edges=[[0, 1]], edge_costs=[[[0, 0], [5, 5], [5, 5], [0, 1]]]
    )
    reduced = reduce(problem, enabled=[DOMINATED])
    assert reduced.kept[0].tolist() == [0, 1]  # 2 ties with 1, 3 is worse than 0


def test_dominated_respects_usage_only_under_a_limit() -> None:
    costs, usages, intervals = [[1, 2]], [[10, 0]], [[0, 1]]
    with_limit = Problem.from_lists(costs=costs, usages=usages, intervals=intervals, usage_limit=100)
    without = Problem.from_lists(costs=costs, usages=usages, intervals=intervals)
    assert reduce(with_limit, enabled=[DOMINATED]).kept[0].tolist() == [0, 1]
    assert reduce(without, enabled=[DOMINATED]).kept[0].tolist() == [0]


def test_project_is_none_for_a_removed_strategy() -> None:
    problem = Problem.from_lists(costs=[[INF, 1, 2], [0, 0]])
    reduced = reduce(problem)
    assert reduced.project(np.array([0, 0])) is None
    assert reduced.project(reduced.lift(np.zeros(2, dtype=np.int64))) is not None


def test_unknown_reduction_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown reductions"):
        reduce(Problem.from_lists(costs=[[1]]), enabled=["forbiden"])


# --------------------------------------------------------------------------- a real instance
def test_real_instance_lifts_costs_exactly() -> None:
    from solver.iopddl import load

    problem = load(INSTANCE_G)
    reduced: Reduced = reduce(problem)
    small = reduced.problem
    assert small.num_edges < problem.num_edges and compact(small).num_nodes < problem.num_nodes
    rng = np.random.default_rng(0)
    for _ in range(5):
        r = rng.integers(0, small.strategy_counts)
        for members in small.groups:
            r[list(members)] = r[members[0]]
        assert evaluate(problem, reduced.lift(r)).cost == evaluate(small, r).cost + reduced.constant
