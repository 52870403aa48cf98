"""The phases where the memory limit binds: memory priced by a Lagrangian ascent, the program over the
strategies its prices make promising (`solver.large.priced`), and the search around the peak
(`solver.large.peak`).

`solver.solve` runs `priced_first_phase` where the whole program would be too large for a backend;
`solver.phases` runs `take_priced` before large neighbourhood search and `peak_search` after the whole
program.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from solver import policy
from solver.backends import get_backend
from solver.backends.base import BackendLimits
from solver.bounds.memory_priced import PricedAscent, memory_priced_ascent
from solver.compact import CompactProblem
from solver.context import SolveContext
from solver.ilp import binding_memory_times, build_program
from solver.large.peak import PeakSettings, peak_lns
from solver.large.priced import promising_strategies, search_restricted
from solver.large.pruned import restrict, solve_over
from solver.large.regions import RegionSearch
from solver.path import program_size
from solver.whole import RestrictedSolver

log = logging.getLogger(__name__)


def priced_first_phase(run: SolveContext) -> None:
    """Tight and too large for the whole program: the memory-priced bound first (it converges in seconds, V:
    1.5 s, short of the share kept for it) -- its prices say which strategies the search should look at --
    then the search around the peak from the best answer, to the bound's deadline."""
    assert run.incumbent is not None
    take_priced(run, run.options.threads, only_whole=False)
    phase = time.perf_counter()
    run.incumbent = peak_search(run, run.incumbent, run.budget.work_deadline)
    run.timings["peak_lns"] = time.perf_counter() - phase
    run.candidates.append(run.incumbent)


def take_priced(run: SolveContext, threads: int, only_whole: bool) -> None:
    """`priced_phase`, its bound and answers taken into the context (the best of them the next start); the
    backends' work then ends at the bound's deadline: the ascent already took the bound's share."""
    priced, answers = priced_phase(run, threads, only_whole)
    run.known_bound = max(run.known_bound, priced)
    run.candidates.extend(answers)
    run.incumbent = answers[-1]
    run.budget.work_deadline = run.budget.bound_deadline


def priced_phase(run: SolveContext, threads: int, only_whole: bool) -> tuple[float, list[np.ndarray]]:
    """`solver.large.priced` from the context's incumbent: the memory-priced ascent for `policy.BOUND_SHARE`
    of the time left (`price_memory`), the root of the Lagrangian search for up to `policy.LAGRANGIAN_SHARE`
    of it, then the program over the strategies both found promising for `policy.PRICED_SHARE` of the time
    to the bound's deadline: whole with the path's backend (timed as ``priced_program``) while it has at most
    `policy.PRICED_WHOLE_MAX_COLUMNS` columns, else region by region around the peak (``priced_lns``); with
    ``only_whole``, nothing after the ascent unless the ascent's strategies alone make a program that fits
    whole. (The ascent's bound, the answers, the best last.)"""
    core, left, backend = run.core, run.budget.left, run.path.backend
    assert run.incumbent is not None
    ascent, incumbent = price_memory(run, run.incumbent, policy.BOUND_SHARE * left)
    if only_whole and (
        ascent.promising is None or not _priced_program_fits(core, ascent.promising, incumbent)
    ):
        return ascent.bound, [incumbent]

    phase = time.perf_counter()
    keep, decoded = promising_strategies(
        core, incumbent, time.perf_counter() + policy.LAGRANGIAN_SHARE * left, also=ascent.promising
    )
    if keep is None:
        return ascent.bound, [incumbent]
    start = decoded if decoded is not None else incumbent
    run.tracker.incumbent("lagrangian", core.cost(start) + run.constant)
    now = time.perf_counter()
    until = now + policy.PRICED_SHARE * (run.budget.bound_deadline - now)
    if program_size(restrict(core, keep)) > policy.PRICED_WHOLE_MAX_COLUMNS:
        search = RegionSearch(backend, run.options.seed, on_incumbent=run.report(f"{backend}-priced-lns"))
        answer = search_restricted(core, keep, start, until, search)
        run.timings["priced_lns"] = time.perf_counter() - phase
        return ascent.bound, [incumbent, answer]

    answer = solve_over(core, keep, start, until, _priced_solver(run, threads))
    run.timings["priced_program"] = time.perf_counter() - phase
    better = answer is not None and core.cost(answer) < core.cost(start)
    return ascent.bound, [incumbent, answer if better else start]


def _priced_solver(run: SolveContext, threads: int) -> RestrictedSolver:
    """The backend on the promising strategies' program, its answers reported as ``<backend>-priced``."""
    backend = run.path.backend

    def solve_restricted(
        restricted: CompactProblem, local: np.ndarray | None, until: float
    ) -> np.ndarray | None:
        # Every row where the limit can bind, from the start: on V's program over 1,821 promising strategies
        # optimal in 17 s, where rows added as HiGHS's LPs violate them (`solve_whole`) took 22 s.
        program = build_program(restricted, memory_times=binding_memory_times(restricted))
        result = get_backend(backend).solve(
            program, BackendLimits(max(0.0, until - time.perf_counter()), threads), warm_start=local
        )
        if result.assignment is not None:
            run.tracker.incumbent(f"{backend}-priced", restricted.cost(result.assignment) + run.constant)
        return result.assignment

    return solve_restricted


def price_memory(run: SolveContext, incumbent: np.ndarray, seconds: float) -> tuple[PricedAscent, np.ndarray]:
    """`memory_priced_ascent` for at most ``seconds``, its steps sized by the ``incumbent``'s cost (timed as
    ``priced_bound``): its result, and the cheaper of the incumbent and its answer."""
    core = run.core
    phase = time.perf_counter()
    ascent = memory_priced_ascent(core, seconds, upper_bound=core.cost(incumbent))
    run.timings["priced_bound"] = time.perf_counter() - phase
    if ascent.answer is not None and ascent.cost < core.cost(incumbent):
        incumbent = ascent.answer
    run.tracker.update("priced", core.cost(incumbent) + run.constant, ascent.bound + run.constant)
    return ascent, incumbent


def _priced_program_fits(core: CompactProblem, promising: list[np.ndarray], incumbent: np.ndarray) -> bool:
    """Whether the program over the ``promising`` strategies and the ``incumbent``'s has at most
    `policy.PRICED_WHOLE_MAX_COLUMNS` columns."""
    keep = [
        np.union1d(kept, [int(s)]).astype(np.int64)
        for kept, s in zip(promising, incumbent.tolist(), strict=True)
    ]
    return program_size(restrict(core, keep)) <= policy.PRICED_WHOLE_MAX_COLUMNS


def peak_search(run: SolveContext, incumbent: np.ndarray, deadline: float) -> np.ndarray:
    """`solver.large.peak.peak_lns` from ``incumbent`` until ``deadline`` or until its answer is proven within
    the gap asked for of the context's known bound, its incumbents reported."""
    backend = run.path.backend
    search = RegionSearch(backend, run.options.seed, on_incumbent=run.report(f"{backend}-peak-lns"))
    settings = PeakSettings(bound=run.known_bound, relative_gap=run.options.relative_gap)
    improved, stats = peak_lns(run.core, incumbent, deadline, search, settings)
    log.info(
        "peak lns: %d regions, %d improved (%d at the peak), %d columns a region at the end",
        stats.regions,
        stats.improved,
        stats.peak_improved,
        stats.region_columns,
    )
    return improved
