"""Searches on other cores: their answers arrive while they run, `stop` ends them and returns their best,
and what uses them (the heuristic's portfolio, large neighbourhood search taking answers offered from
outside, `solve` in LNS mode) stays feasible, never worse than its start, and leaves no process behind."""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections.abc import Callable

import numpy as np
import pytest

from solver.compact import compact
from solver.evaluate import evaluate
from solver.heuristics.anytime import HeuristicRun
from solver.heuristics.portfolio import background_search, portfolio_solve
from solver.heuristics.state import flatten, min_usage_assignment
from solver.large.regions import take_offered
from solver.parallel import Channel, ForkedSearch, can_fork
from tests.solver.random_problems import brute_force, large_problem, tight_problem

pytestmark = pytest.mark.skipif(not can_fork(), reason="forked searches need the fork start method")


@pytest.fixture
def started_here() -> Callable[[], list[multiprocessing.process.BaseProcess]]:
    """The child processes alive now that were not alive when the test began (the session's gloo ranks, shared
    between tests, are children too and stay)."""
    before = {child.pid for child in multiprocessing.active_children()}
    return lambda: [child for child in multiprocessing.active_children() if child.pid not in before]


def _counting_down(channel: Channel) -> tuple[float, np.ndarray]:
    """Finds 10, 9, ..., 1 as fast as it can (most wait for the send interval), then 0.5 a while later."""
    for cost in range(10, 0, -1):
        channel.found(float(cost), np.full(3, cost))
    time.sleep(0.5)
    channel.found(0.5, np.zeros(3, dtype=np.int64))
    return 0.5, np.zeros(3, dtype=np.int64)


def test_answers_arrive_while_the_search_runs_and_stop_returns_the_best(
    started_here: Callable[[], list],
) -> None:
    search = ForkedSearch(_counting_down)
    deadline = time.monotonic() + 5
    seen = []
    while time.monotonic() < deadline and not seen:
        answer = search.poll()
        if answer is not None:
            seen.append(answer[0])
        time.sleep(0.01)
    assert seen and 1 <= seen[0] <= 10  # the first answer sent at once, later ones at most every 0.25 s
    cost, best = search.stop()  # type: ignore[misc]
    assert cost == 0.5 and best.tolist() == [0, 0, 0]
    assert search.poll() is None
    assert not started_here()


def _forever(channel: Channel) -> tuple[float, np.ndarray]:
    channel.found(3.0, np.zeros(2, dtype=np.int64))
    while not channel.halted():
        time.sleep(0.01)
    return 2.0, np.ones(2, dtype=np.int64)


def test_stop_ends_a_search_that_would_run_on(started_here: Callable[[], list]) -> None:
    search = ForkedSearch(_forever)
    time.sleep(0.3)
    started = time.monotonic()
    cost, best = search.stop()  # type: ignore[misc]
    assert time.monotonic() - started < 2.0
    assert (cost, best.tolist()) == (2.0, [1, 1])
    assert not started_here()


def test_a_search_dropped_without_stop_is_told_to_stop(started_here: Callable[[], list]) -> None:
    search = ForkedSearch(_forever)
    time.sleep(0.3)
    del search
    gc.collect()
    deadline = time.monotonic() + 5
    while started_here() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not started_here()


def test_an_offered_answer_is_taken_only_when_cheaper_and_within_memory() -> None:
    rng = np.random.default_rng(11)
    problem = tight_problem(rng)
    core = compact(problem)
    _, optimum = brute_force(problem)
    lean = min_usage_assignment(flatten(core))
    best = np.asarray(optimum, dtype=np.int64)
    lean_cost, best_cost = core.cost(lean), core.cost(best)
    assert best_cost < lean_cost
    taken, cost = take_offered(core, lean, lean_cost, lambda: (best_cost, best))
    assert taken.tolist() == best.tolist() and cost == best_cost
    kept, cost = take_offered(core, best, best_cost, lambda: (lean_cost, lean))
    assert kept.tolist() == best.tolist() and cost == best_cost
    # the memory-free optimum is cheaper still, but breaks the limit: never taken
    free = problem.replace(usage_limit=None)
    _, cheapest = brute_force(free)
    over = np.asarray(cheapest, dtype=np.int64)
    assert core.cost(over) < best_cost
    kept, cost = take_offered(core, best, best_cost, lambda: (core.cost(over), over))
    assert kept.tolist() == best.tolist()
    assert take_offered(core, best, best_cost, lambda: None)[1] == best_cost


def test_a_background_heuristic_sends_feasible_improving_answers_and_the_portfolio_reads_them(
    started_here: Callable[[], list],
) -> None:
    problem = large_problem(np.random.default_rng(2), nodes=1_500)
    core = compact(problem)
    search = background_search(core, time_limit=3.0, seed=1)
    costs = []
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline and len(costs) < 3:
        answer = search.poll()
        if answer is not None:
            costs.append(answer[0])
            assert evaluate(problem, core.lift(answer[1])).feasible
            assert answer[0] == pytest.approx(core.cost(answer[1]))
        time.sleep(0.05)
    assert len(costs) >= 2 and costs == sorted(costs, reverse=True)
    final = search.stop()
    assert final is not None and final[0] <= costs[-1]

    reported: list[float] = []
    other = background_search(core, time_limit=1.5, seed=5)
    run = HeuristicRun(on_incumbent=lambda cost, _a: reported.append(cost))
    answer = portfolio_solve(core, 1.5, threads=2, run=run, background=[other])
    assert answer is not None and evaluate(problem, core.lift(answer)).feasible
    assert core.cost(answer) == pytest.approx(min(reported))
    assert other.stop() is not None  # left running by the portfolio, stopped here
    assert not started_here()


def test_solve_in_lns_mode_searches_on_the_second_core_and_leaves_no_process(
    monkeypatch: pytest.MonkeyPatch, started_here: Callable[[], list]
) -> None:
    import solver.policy as policy
    import solver.solve as pipeline

    monkeypatch.setattr(policy, "FULL_PROGRAM_MAX_VARIABLES", -1)
    problem = large_problem(np.random.default_rng(4), nodes=800)
    result = pipeline.solve(problem, pipeline.SolveOptions(backend="highs", time_limit=4, threads=2))
    assert result.backend == "highs (lns)"
    evaluation = evaluate(problem, result.solution)
    assert evaluation.feasible and evaluation.cost == pytest.approx(result.cost)
    assert result.bound <= result.cost
    assert not started_here()


def _report_can_fork(answers: multiprocessing.Queue) -> None:
    answers.put(can_fork())


def test_a_daemon_process_runs_its_searches_itself() -> None:
    """The service's job workers are daemons, which may not start processes: their portfolio stays in
    them (a 3-D candidate of a service search failed: "daemonic processes are not allowed to have
    children")."""
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    daemon = context.Process(target=_report_can_fork, args=(answers,), daemon=True)
    daemon.start()
    daemon.join(30)
    assert answers.get(timeout=5) is False
    assert can_fork() is True
