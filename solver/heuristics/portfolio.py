"""Run the heuristic on several cores at once: one process per seed, the best feasible answer wins.

The heuristic is single-threaded numba code; with ``threads`` cores it runs ``threads`` independent
searches (seeds ``seed, seed + 1, ...``): one in this process, the others in forked processes
(`background_search`, `solver.parallel`) that send their improving answers back as they find them. On one
core, two searches take turns in this process.

A background search may also outlive the portfolio: `solver.solve` keeps one searching on the second core
while large neighbourhood search runs on the first, and takes its answers whenever they are cheaper.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from solver.compact import CompactProblem
from solver.heuristics.anytime import HeuristicRun, heuristic_solve
from solver.parallel import Answer, Channel, ForkedSearch, can_fork

IncumbentCallback = Callable[[float, np.ndarray], None]
#: On one core, this many searches take turns in the process (`heuristic_solve`'s ``searches``): what two
#: processes would give, without the second process.
ONE_CORE_SEARCHES = 2


def background_search(
    problem: CompactProblem,
    time_limit: float,
    seed: int,
    initial: np.ndarray | None = None,
) -> ForkedSearch:
    """`heuristic_solve` in a forked process (a core of its own) until ``time_limit`` or `ForkedSearch.stop`;
    its improving answers arrive through `ForkedSearch.poll`."""

    def run(channel: Channel) -> Answer | None:
        run = HeuristicRun(seed, initial, on_incumbent=channel.found, stop=channel.halted)
        answer = heuristic_solve(problem, time_limit, run)
        return None if answer is None else (problem.cost(answer), answer)

    return ForkedSearch(run)


def portfolio_solve(
    problem: CompactProblem,
    time_limit: float,
    threads: int,
    run: HeuristicRun | None = None,
    background: Sequence[ForkedSearch] = (),
) -> np.ndarray | None:
    """Best feasible super-node assignment over ``threads`` heuristic searches (one in this process), each
    run as ``run`` says (seeds ``run.seed``, ``run.seed + 1``, ...).

    ``run.stop`` (asked between chunks of work) ends every search early. ``background``: searches already
    running on other cores (counted in ``threads``): their answers are read too, and they are left running.
    """
    run = run or HeuristicRun()
    seed, initial, on_incumbent, stop = run.seed, run.initial, run.on_incumbent, run.stop
    own_background = []
    if can_fork():
        own_background = [
            background_search(problem, time_limit, seed + k, initial)
            for k in range(1, threads - len(background))
        ]
    running = [*own_background, *background]
    best: list[Answer] = []  # the cheapest answer seen, alone

    def offer(cost: float, assignment: np.ndarray) -> None:
        if not best or cost < best[0][0]:
            best[:] = [(cost, assignment)]
            if on_incumbent is not None:
                on_incumbent(cost, assignment)

    def read_then_ask() -> bool:
        for search in running:
            answer = search.poll()
            if answer is not None:
                offer(*answer)
        return stop is not None and stop()

    own_run = HeuristicRun(seed, initial, on_incumbent=offer, stop=read_then_ask)
    own = heuristic_solve(problem, time_limit, own_run, searches=1 if running else ONE_CORE_SEARCHES)
    if own is not None:
        offer(problem.cost(own), own)
    for search in own_background:
        answer = search.stop()
        if answer is not None:
            offer(*answer)
    read_then_ask()
    return best[0][1] if best else None
