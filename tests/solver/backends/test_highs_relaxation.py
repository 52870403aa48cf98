"""The HiGHS backend's relaxation-first machinery: the memory profile it separates rows from, and the
branching that raises the relaxation's bound when a gap is allowed."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from solver.backends.base import FEASIBLE, INFEASIBLE, BackendLimits
from solver.backends.highs import HighsBackend, _out_of_time_for_mip
from solver.backends.highs_relaxation import (
    _CUT_OFF,
    LARGEST_LP_COST,
    BestAnswer,
    _objective_scale,
    _solve_separating,
    fractional_node,
    memory_weight,
    separated_relaxation,
)
from solver.compact import compact
from solver.errors import InfeasibleError
from solver.evaluate import evaluate
from solver.ilp import binding_memory_times, build_program
from solver.problem import Problem
from tests.solver.random_problems import brute_force, random_problem


def _every_assignment(counts: np.ndarray):
    return itertools.product(*(range(int(c)) for c in counts))


def test_memory_profile_rows_measure_the_usage_of_every_assignment() -> None:
    """For every assignment of small random problems, the profile's left-hand sides plus the constant part
    equal the bytes live at each binding time step, and `over` names exactly the steps above the limit."""
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(60):
        problem = random_problem(rng, with_limit=True, forbidden_rate=0.0)
        core = compact(problem)
        try:
            program = build_program(core, memory_times=np.zeros(0, np.int64))
        except InfeasibleError:
            continue
        profile = program.memory_profile
        if profile is None:
            assert len(binding_memory_times(core)) == 0
            continue
        limit = int(core.usage_limit or 0)
        starts, ends = core.term_intervals[:, 0], core.term_intervals[:, 1]
        for assignment in _every_assignment(core.strategy_counts):
            chosen = np.asarray(assignment, dtype=np.int64)
            columns = program.columns(chosen)
            if columns is None:
                continue
            used = np.array(
                [u[chosen[k]] for u, k in zip(core.term_usages, core.term_node.tolist(), strict=True)]
            )
            live = np.array([used[(starts <= t) & (ends > t)].sum() for t in profile.times])
            lhs = profile.usage(columns)
            # lhs - upper is (bytes - limit) in memory units, so the sign tells whether the step overflows
            assert np.array_equal(lhs - profile.upper > 1e-9, live > limit)
            over = profile.over(columns)
            assert sorted(over.tolist()) == np.flatnonzero(live > limit).tolist()
            rows = profile.rows(np.arange(len(profile.times)))
            assert np.allclose(rows @ columns, lhs)
            checked += 1
    assert checked > 200


def _memory_bound_problem(layers: int, cost_scale: float = 1.0) -> Problem:
    """A chain whose memory limit is met by mixing two placements: each node either keeps a big copy
    (cheap) or a small one (dear); the limit fits about half the big copies, so the LP relaxation is
    fractional and the integer optimum lies strictly above it."""
    costs, usages, intervals = [], [], []
    for i in range(layers):
        costs.append(cost_scale * np.array([10.0 + i % 3, 17.0 + 2 * (i % 2)]))
        usages.append(np.array([7 + i % 4, 1]))
        intervals.append((0, 10))
    edges = [(i, i + 1) for i in range(layers - 1)]
    matrices = [cost_scale * np.array([[0.0, 1.5], [1.5, 0.0]]) for _ in edges]
    limit = int(sum(u[0] for u in usages) * 0.55)
    return Problem.from_lists(
        costs=costs,
        usages=usages,
        intervals=np.array(intervals),
        edges=edges,
        edge_costs=matrices,
        usage_limit=limit,
        name="mixing",
    )


@pytest.mark.parametrize("relative_gap", [0.0, 0.02, 0.1])
def test_backend_keeps_its_gap_and_a_valid_bound_when_the_relaxation_mixes(relative_gap: float) -> None:
    problem = _memory_bound_problem(12)
    expected, _ = brute_force(problem)
    assert expected is not None
    core = compact(problem)
    program = build_program(core, memory_times=np.zeros(0, np.int64))  # rows come from the profile
    relaxation = separated_relaxation(program, time_limit=10, threads=1)
    assert relaxation is not None and relaxation.bound < expected - 0.5  # the relaxation mixes
    result = HighsBackend().solve(program, BackendLimits(20, 1, relative_gap=relative_gap))
    assert result.status != INFEASIBLE and result.assignment is not None
    evaluation = evaluate(problem, core.lift(result.assignment))
    assert evaluation.feasible, evaluation.violations
    assert evaluation.cost == pytest.approx(result.objective)
    assert result.bound <= expected + 1e-9 <= result.objective + 2e-9
    assert result.objective - result.bound <= relative_gap * result.objective + 1e-6
    if relative_gap == 0.0:
        assert result.objective == pytest.approx(expected)


def test_random_memory_limited_problems_with_a_gap() -> None:
    """Random problems, program without memory rows, a 5% gap: answers fit, bounds never pass the optimum."""
    rng = np.random.default_rng(17)
    solved = 0
    for case in range(150):
        problem = random_problem(rng, nodes=(3, 7), with_limit=True)
        expected, _ = brute_force(problem)
        core = compact(problem)
        try:
            program = build_program(core, memory_times=np.zeros(0, np.int64))
        except InfeasibleError:
            assert expected is None
            continue
        result = HighsBackend().solve(program, BackendLimits(10, 2, relative_gap=0.05))
        if expected is None:
            assert result.assignment is None, case
            continue
        if result.assignment is None:
            continue  # an MIP answer over the rows separated so far overflowed: `solve` adds rows and retries
        evaluation = evaluate(problem, core.lift(result.assignment))
        assert evaluation.feasible, (case, evaluation.violations)
        assert result.bound <= expected + 1e-6, case
        assert expected <= result.objective + 1e-6, case
        assert result.objective - result.bound <= 0.05 * abs(result.objective) + 1.0, case
        solved += 1
    assert solved >= 40


@pytest.mark.parametrize("cost_scale", [1.0, 1e6])
@pytest.mark.parametrize("begin_early", [False, True])
def test_early_first_lp_and_scaled_costs_keep_the_answer(cost_scale: float, begin_early: bool) -> None:
    """The first LP begun in a thread (`HighsBackend.begin`, as `solve` does while its heuristic runs) and
    costs large enough for HiGHS's objective scaling give the optimum, with a bound that never passes it."""
    problem = _memory_bound_problem(12, cost_scale)
    expected, _ = brute_force(problem)
    assert expected is not None
    core = compact(problem)
    program = build_program(core, memory_times=np.zeros(0, np.int64))
    backend = HighsBackend()
    started = backend.begin(program, time_limit=20, threads=2) if begin_early else None
    if begin_early:
        assert started is not None and started.program is program
    for relative_gap in (0.0, 0.02):
        result = backend.solve(program, BackendLimits(20, 2, relative_gap=relative_gap), started=started)
        started = None  # its first LP is spent
        assert result.assignment is not None
        evaluation = evaluate(problem, core.lift(result.assignment))
        assert evaluation.feasible and evaluation.cost == pytest.approx(result.objective)
        assert result.bound <= expected * (1 + 1e-12) and expected <= result.objective * (1 + 1e-12)
        if relative_gap == 0.0:
            assert result.objective == pytest.approx(expected)


def test_objective_scale_brings_the_largest_cost_under_the_limit() -> None:
    small = build_program(compact(_memory_bound_problem(6)), memory_times=np.zeros(0, np.int64))
    large = build_program(compact(_memory_bound_problem(6, 1e6)), memory_times=np.zeros(0, np.int64))
    assert _objective_scale(small) == 0
    exponent = _objective_scale(large)
    largest = float(np.abs(large.objective).max())
    assert largest * 2.0**exponent <= LARGEST_LP_COST < largest * 2.0 ** (exponent + 1)


def test_cutoff_stops_a_child_lp_of_a_scaled_program() -> None:
    """A child LP whose dual objective already passes the cut-off stops at once, also when HiGHS scales the
    objective (its ``objective_bound`` option is compared with the scaled objective)."""
    program = build_program(compact(_memory_bound_problem(12, 1e6)), memory_times=np.zeros(0, np.int64))
    assert _objective_scale(program) < 0
    relaxation = separated_relaxation(program, time_limit=10, threads=1)
    assert relaxation is not None
    node = fractional_node(program, relaxation.values, memory_weight(program))
    assert node is not None
    start = program.x_offset[node]
    chosen = start + int(np.argmax(relaxation.values[start : start + program.strategy_counts[node]]))
    basis = relaxation.highs.getBasis()
    relaxation.highs.changeColBounds(int(chosen), 0.0, 0.0)  # forbid it, as `branch_on_relaxation` does
    relaxation.highs.setBasis(basis)
    cutoff = (relaxation.bound - program.constant) * (1 - 1e-4)  # HiGHS's own objective: no constant
    ended, values = _solve_separating(
        relaxation.highs, relaxation.extra_rows, deadline=time.perf_counter() + 10, threads=1, cutoff=cutoff
    )
    assert ended == _CUT_OFF and values is None


def test_no_whole_program_mip_starts_with_less_time_left_than_the_lps_before_it_took() -> None:
    """HiGHS's presolve alone overruns a short MIP limit on a large program (1.7 s of probing on a 0.44 s
    limit): with less time left than the backend has spent, the best answer stands with the LP's bound."""
    rng = np.random.default_rng(3)
    problem = random_problem(rng, nodes=(5, 5), with_limit=False)
    program = build_program(compact(problem), memory_times=np.zeros(0, np.int64))
    answer = HighsBackend().solve(program, BackendLimits(10, 1)).assignment
    assert answer is not None
    best, now = BestAnswer(program, answer), time.perf_counter()
    stopped = _out_of_time_for_mip(best, 1.5, begun=now - 2.0, deadline=now + 1.0)
    assert stopped is not None and stopped.status == FEASIBLE
    assert np.array_equal(stopped.assignment, answer) and stopped.bound == 1.5
    assert stopped.objective == best.objective and stopped.seconds >= 2.0
    assert _out_of_time_for_mip(best, 1.5, begun=now - 1.0, deadline=now + 2.0) is None
    assert _out_of_time_for_mip(BestAnswer(program, None), 1.5, begun=now - 2.0, deadline=now + 1.0) is None
