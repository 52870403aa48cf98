"""Run the heuristic on several cores at once: one process per seed, the best feasible answer wins.

The heuristic is single-threaded numba code; with ``threads`` cores it runs ``threads`` independent
searches (seeds ``seed, seed + 1, ...``) in forked processes that share nothing but a queue of incumbent
costs, which the parent forwards to its progress callback as they come. On one core, two searches take
turns in this process.
"""

from __future__ import annotations

import math
import multiprocessing
import queue
import time
from collections.abc import Callable

import numpy as np

from solver.compact import CompactProblem
from solver.heuristics.anytime import heuristic_solve

IncumbentCallback = Callable[[float, np.ndarray], None]
#: On one core, this many searches take turns in the process (`heuristic_solve`'s ``searches``): what two
#: processes would give, without the second process.
ONE_CORE_SEARCHES = 2


def portfolio_solve(
    problem: CompactProblem,
    time_limit: float,
    threads: int,
    seed: int = 0,
    initial: np.ndarray | None = None,
    on_incumbent: IncumbentCallback | None = None,
    stop: Callable[[], bool] | None = None,
) -> np.ndarray | None:
    """Best feasible super-node assignment over ``threads`` heuristic searches (one in this process).

    ``stop`` (asked between chunks of work) ends the search in this process early; forked searches run to
    ``time_limit``.
    """
    if threads <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return heuristic_solve(
            problem,
            time_limit,
            seed=seed,
            initial=initial,
            on_incumbent=on_incumbent,
            stop=stop,
            searches=ONE_CORE_SEARCHES,
        )
    context = multiprocessing.get_context("fork")
    costs: multiprocessing.Queue = context.Queue()
    results: multiprocessing.Queue = context.Queue()
    workers = [
        context.Process(
            target=_worker, args=(problem, time_limit, seed + k, initial, costs, results), daemon=True
        )
        for k in range(1, threads)
    ]
    for worker in workers:
        worker.start()
    best_cost = [math.inf]

    def forward(cost: float, assignment: np.ndarray) -> None:
        if cost < best_cost[0]:
            best_cost[0] = cost
            if on_incumbent is not None:
                on_incumbent(cost, assignment)

    def drain() -> None:
        while True:
            try:
                cost = costs.get_nowait()
            except queue.Empty:
                return
            forward(cost, np.zeros(0, np.int64))

    def drain_then_ask() -> bool:
        drain()
        return stop is not None and stop()

    own = heuristic_solve(
        problem, time_limit, seed=seed, initial=initial, on_incumbent=forward, stop=drain_then_ask
    )
    candidates = [own] if own is not None else []
    deadline = time.monotonic() + 10.0
    for _ in workers:
        try:
            answer = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if answer is not None:
            candidates.append(answer)
    for worker in workers:
        worker.join(timeout=1.0)
        if worker.is_alive():
            worker.terminate()
    drain()
    if not candidates:
        return None
    return min(candidates, key=problem.cost)


def _worker(
    problem: CompactProblem,
    time_limit: float,
    seed: int,
    initial: np.ndarray | None,
    costs: multiprocessing.Queue,
    results: multiprocessing.Queue,
) -> None:
    answer = heuristic_solve(
        problem, time_limit, seed=seed, initial=initial, on_incumbent=lambda cost, _a: costs.put(cost)
    )
    results.put(answer)
