"""The headroom pass: of the answers proven within the gap, the one whose peak is smallest."""

from __future__ import annotations

import dataclasses
import time

import pytest

import solver.headroom as headroom
from solver.headroom import with_headroom
from solver.problem import Problem
from solver.solve import SolveOptions, SolveResult, solve

GAP = 0.01


def one_choice(costs: list[float], usages: list[int]) -> Problem:
    """One node alive over the whole step: its strategies trade cost for memory."""
    return Problem.from_lists(costs=[costs], usages=[usages], intervals=[[0, 1]])


def test_the_least_peak_within_the_gap_of_the_bound_is_taken() -> None:
    # fastest 100 (peak 10); 100.5 (peak 5) is within 1% of the bound; 102 (peak 1) is not
    problem = one_choice([100.0, 100.5, 102.0], [10, 5, 1])
    fastest = solve(problem, SolveOptions(relative_gap=GAP))
    assert fastest.solution == [0] and fastest.peak_usage == 10

    found = with_headroom(problem, fastest, SolveOptions(relative_gap=GAP, time_limit=10.0))

    assert found.result.solution == [1]
    assert found.result.cost == pytest.approx(100.5) and found.result.peak_usage == 5
    # the certificate stands: the time-optimal solve's bound, the answer proven within the gap by it
    assert found.result.bound == fastest.bound == pytest.approx(100.0)
    assert found.result.gap == pytest.approx(0.5 / 100.5)
    assert found.result.status == "feasible"
    assert (found.fastest_cost, found.fastest_peak) == (pytest.approx(100.0), 10)
    assert 1 <= found.probes <= 4


def test_without_a_gap_only_an_answer_as_cheap_as_the_bound_may_replace_the_fastest() -> None:
    problem = one_choice([100.0, 100.0, 100.5], [10, 7, 1])
    fastest = solve(problem, SolveOptions(relative_gap=0.0))

    found = with_headroom(problem, fastest, SolveOptions(relative_gap=0.0, time_limit=10.0))

    assert found.result.solution == [1] and found.result.peak_usage == 7
    assert found.result.gap == 0.0 and found.result.status == fastest.status == "optimal"


def test_where_every_smaller_peak_costs_more_than_the_gap_the_fastest_answer_stays() -> None:
    problem = one_choice([100.0, 103.0], [10, 1])
    fastest = solve(problem, SolveOptions(relative_gap=GAP))

    found = with_headroom(problem, fastest, SolveOptions(relative_gap=GAP, time_limit=10.0))

    assert found.result is fastest
    assert found.probes >= 1


def test_an_answer_the_caller_refuses_counts_as_one_above_the_cap() -> None:
    # 100.5 (peak 5) is within the gap by the objective, but the caller's truer measure (the planner's
    # simulated step) refuses it: the fastest answer stays
    problem = one_choice([100.0, 100.5], [10, 5])
    fastest = solve(problem, SolveOptions(relative_gap=GAP))
    judged: list[list[int] | None] = []

    def refuse_the_small_peak(answer: SolveResult) -> bool:
        judged.append(answer.solution)
        return answer.solution != [1]

    found = with_headroom(
        problem, fastest, SolveOptions(relative_gap=GAP, time_limit=10.0), accept=refuse_the_small_peak
    )

    assert found.result is fastest
    assert judged and all(solution == [1] for solution in judged)
    assert with_headroom(
        problem, fastest, SolveOptions(relative_gap=GAP, time_limit=10.0), accept=lambda _: True
    ).result.solution == [1]


def test_no_time_no_probe() -> None:
    problem = one_choice([100.0, 100.5], [10, 5])
    fastest = solve(problem, SolveOptions(relative_gap=GAP))

    found = with_headroom(problem, fastest, SolveOptions(relative_gap=GAP, time_limit=0.0))

    assert found.result is fastest and found.probes == 0


def test_a_memory_limit_of_the_problem_stays_the_plans_limit() -> None:
    # two nodes alive together: the peak is their sum; the problem's own limit (20) is kept on the answer
    problem = Problem.from_lists(
        costs=[[100.0, 100.4], [50.0, 50.2]],
        usages=[[10, 4], [8, 3]],
        intervals=[[0, 2], [0, 2]],
        usage_limit=20,
    )
    fastest = solve(problem, SolveOptions(relative_gap=GAP))
    assert fastest.peak_usage == 18

    found = with_headroom(problem, fastest, SolveOptions(relative_gap=GAP, time_limit=10.0))

    assert found.result.solution == [1, 1] and found.result.peak_usage == 7
    assert found.result.usage_limit == 20


def test_an_answerless_solve_is_refused() -> None:
    problem = one_choice([100.0], [10])
    fastest = solve(problem)
    answerless = dataclasses.replace(fastest, solution=None, cost=None)
    with pytest.raises(ValueError, match="no answer"):
        with_headroom(problem, answerless, SolveOptions(relative_gap=GAP, time_limit=1.0))


def test_probes_are_told_the_cap_and_none_starts_with_less_time_than_the_last_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A probe given less time than the last one took would end worse: the pass stops instead. Every probe
    is given the cap, so that one whose bound proves nothing fits under it stops early."""
    problem = one_choice([100.0, 100.2, 100.4, 100.6], [10, 8, 6, 4])
    fastest = solve(problem, SolveOptions(relative_gap=GAP))
    calls: list[SolveOptions] = []

    def slow_solve(probe: Problem, options: SolveOptions) -> SolveResult:
        calls.append(options)
        time.sleep(0.3)
        return solve(probe, SolveOptions(relative_gap=GAP))

    monkeypatch.setattr(headroom, "solve", slow_solve)
    found = with_headroom(problem, fastest, SolveOptions(relative_gap=GAP, time_limit=0.5))

    assert found.probes == 1 and len(calls) == 1  # 0.2 s left after a 0.3 s probe: no second one
    assert calls[0].cutoff == pytest.approx(fastest.bound / (1 - GAP))
    assert found.result.peak_usage < 10
