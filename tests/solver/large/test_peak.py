"""Search around the memory peak: never worse, always feasible, it reaches the optimum of small tight
problems; the bound with memory priced in; `solve` on tight problems (the search over promising strategies
where the whole program is too large, progress lines with feasible incumbents only)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solver.bounds.memory_priced import memory_dual_bound, memory_priced_ascent
from solver.bounds.trws import dual_bound
from solver.compact import compact
from solver.evaluate import evaluate
from solver.heuristics.state import flatten, min_usage_assignment
from solver.large.peak import PeakSettings, peak_lns
from solver.large.priced import promising_strategies, search_restricted
from solver.large.regions import RegionSearch
from solver.solve import SolveOptions, solve
from tests.solver.random_problems import brute_force, tight_problem


def test_small_regions_reach_the_optimum_of_tight_problems() -> None:
    rng = np.random.default_rng(3)
    reached = 0
    for _ in range(12):
        problem = tight_problem(rng)
        expected, _ = brute_force(problem)
        core = compact(problem)
        start = min_usage_assignment(flatten(core))
        # a budget of 12 columns: two or three nodes a region, never the whole program
        best, stats = peak_lns(
            core, start, time.perf_counter() + 1.0, settings=PeakSettings(region_columns=12, max_columns=12)
        )
        evaluation = evaluate(problem, core.lift(best))
        assert evaluation.feasible
        assert evaluation.cost <= evaluate(problem, core.lift(start)).cost
        assert stats.regions > 0
        reached += evaluation.cost == expected
    assert reached >= 10


def test_the_memory_priced_bound_lies_between_the_memory_free_bound_and_the_optimum() -> None:
    rng = np.random.default_rng(4)
    raised = 0
    for _ in range(12):
        problem = tight_problem(rng)
        expected, _ = brute_force(problem)
        memory_free = dual_bound(compact(problem.replace(usage_limit=None)), time_limit=1.0)
        core = compact(problem)
        priced = memory_dual_bound(core, time_limit=1.0, upper_bound=expected)
        assert priced <= expected + 1e-6
        raised += priced > memory_free + 1e-6
    assert raised >= 9


def test_the_memory_priced_ascent_marks_its_answer_and_an_optimum_of_most_tight_problems() -> None:
    rng = np.random.default_rng(11)
    covered = kept = total = 0
    for _ in range(20):
        problem = tight_problem(rng, nodes=(6, 8))
        expected, optimum = brute_force(problem)
        core = compact(problem)
        ascent = memory_priced_ascent(core, time_limit=1.0)
        assert ascent.promising is not None
        assert ascent.bound <= expected + 1e-6
        assert all(len(k) > 0 and np.all(np.diff(k) > 0) for k in ascent.promising)
        if ascent.answer is not None:
            assert evaluate(problem, core.lift(ascent.answer)).feasible
            assert core.cost(ascent.answer) == ascent.cost >= expected
            assert all(s in k for s, k in zip(ascent.answer.tolist(), ascent.promising, strict=True))
        best = np.zeros(core.num_nodes, dtype=np.int64)
        best[core.node_of] = optimum
        covered += all(s in k for s, k in zip(best.tolist(), ascent.promising, strict=True))
        kept += sum(len(k) for k in ascent.promising)
        total += int(core.strategy_counts.sum())
    assert covered >= 14  # measured: 16 of 20
    assert kept < 0.9 * total  # a restriction, not every strategy


def test_solve_on_tight_problems_finds_the_optimum_and_reports_only_feasible_incumbents() -> None:
    rng = np.random.default_rng(5)
    for _ in range(4):
        problem = tight_problem(rng, nodes=(6, 7))
        expected, _ = brute_force(problem)
        seen: list[float] = []

        def record(_phase: str, _s: float, cost: float, _bound: float, seen: list[float] = seen) -> None:
            seen.append(cost)

        result = solve(problem, SolveOptions(backend="highs", time_limit=3, threads=1), progress=record)
        assert result.cost == expected
        assert result.bound <= expected
        # the memory-free optimum breaks the limit: no progress line may show an incumbent below the optimum
        assert min(seen) >= expected


def test_the_promising_strategies_hold_the_incumbent_and_the_restricted_search_never_loses_it() -> None:
    rng = np.random.default_rng(6)
    for _ in range(6):
        problem = tight_problem(rng)
        core = compact(problem)
        start = min_usage_assignment(flatten(core))
        keep, decoded = promising_strategies(core, start, time.perf_counter() + 1.0)
        assert keep is not None
        assert all(s in kept for s, kept in zip(start.tolist(), keep, strict=True))
        if decoded is not None:
            assert evaluate(problem, core.lift(decoded)).feasible
        best = search_restricted(core, keep, start, time.perf_counter() + 0.5, RegionSearch())
        assert all(s in kept for s, kept in zip(best.tolist(), keep, strict=True))
        evaluation = evaluate(problem, core.lift(best))
        assert evaluation.feasible
        assert evaluation.cost <= core.cost(start)


@pytest.mark.parametrize("whole", [True, False], ids=["program-whole", "program-by-regions"])
def test_solve_searches_the_promising_strategies_first_when_the_whole_program_is_too_large(
    monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    import solver.policy as policy
    import solver.solve as pipeline

    monkeypatch.setattr(policy, "PEAK_WHOLE_MAX_COLUMNS", -1)
    if not whole:
        monkeypatch.setattr(policy, "PRICED_WHOLE_MAX_COLUMNS", -1)
    rng = np.random.default_rng(7)
    for _ in range(3):
        problem = tight_problem(rng)
        expected, _ = brute_force(problem)
        result = pipeline.solve(problem, pipeline.SolveOptions(backend="highs", time_limit=3, threads=1))
        phase = "priced_program" if whole else "priced_lns"
        assert phase in result.timings and "peak_lns" in result.timings
        assert result.variables == 0  # the whole program never ran
        assert result.cost == expected
        assert result.bound <= expected


def test_solve_too_large_for_the_whole_program_prices_memory_then_solves_the_promising_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import solver.policy as policy
    import solver.solve as pipeline

    monkeypatch.setattr(policy, "FULL_PROGRAM_MAX_VARIABLES", -1)  # large neighbourhood search mode
    monkeypatch.setattr(policy, "PRUNED_MAX_NODES", -1)  # many nodes: not the pruned solve
    rng = np.random.default_rng(8)
    for _ in range(3):
        problem = tight_problem(rng)
        expected, _ = brute_force(problem)
        result = pipeline.solve(problem, pipeline.SolveOptions(backend="highs", time_limit=3, threads=1))
        assert result.backend == "highs (lns)"
        assert "priced_bound" in result.timings and "priced_program" in result.timings
        assert result.cost == expected
        assert result.bound <= expected
