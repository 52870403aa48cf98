"""A backend on a whole program (the problem's, or a restricted one's), memory rows added lazily.

`solve_whole` is the one way the pipeline hands a `CompactProblem` to a backend whole; `restricted_solver`
wraps it for the solves over a subset of strategies (`solver.large.pruned`: the pruned solve, the program
over the Lagrangian search's promising strategies).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from solver import policy
from solver.backends import get_backend
from solver.backends.base import (
    FEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    BackendLimits,
    BackendResult,
    Started,
    closing_gap,
)
from solver.compact import CompactProblem
from solver.ilp import IntegerProgram, binding_memory_times, build_program, memory_times_over

log = logging.getLogger(__name__)

#: What `solver.large.pruned.solve_over` calls: (restricted problem, start or None, deadline) -> its answer.
RestrictedSolver = Callable[[CompactProblem, np.ndarray | None, float], np.ndarray | None]


def _quiet(_cost: float, _bound: float) -> None:
    """No progress to report (a restricted program's)."""


@dataclass(frozen=True)
class BackendSettings:
    """How a backend runs: which, on how many threads, stopping at what proven gap, reporting where."""

    backend: str
    threads: int
    relative_gap: float = 0.0
    on_progress: Callable[[float, float], None] = _quiet
    """Called with (cost, bound) of the program as the backend improves them."""


def begin_whole(
    core: CompactProblem, backend_name: str, deadline: float, threads: int, timings: dict[str, float]
) -> Started | None:
    """The backend's first work on the whole program (`Backend.begin`: HiGHS's memory-free LP), started in a
    thread before the heuristic when the program starts without memory rows and a second core is there."""
    backend = get_backend(backend_name)
    if threads < 2 or not backend.separates_memory:
        return None
    phase = time.perf_counter()
    program = build_program(core, memory_times=np.zeros(0, np.int64))
    timings["build"] = time.perf_counter() - phase
    return backend.begin(program, max(0.5, deadline - time.perf_counter()), threads)


def solve_whole(
    core: CompactProblem,
    settings: BackendSettings,
    incumbent: np.ndarray | None,
    deadline: float,
    timings: dict[str, float] | None = None,
    first_work: Started | None = None,
) -> tuple[BackendResult, int, int]:
    """(result, variables, constraints) of the backend on the whole program, memory rows added lazily.

    Only steps where some assignment could exceed the limit need a ``memory_cap`` row
    (`binding_memory_times`); of those, the program starts with the ones the incumbent fills to
    `policy.LAZY_MEMORY_START` or more -- or with none for a backend that adds the rows its LP solutions
    violate itself (`separates_memory`). When the backend's answer exceeds the limit somewhere, the steps it
    violates are added and the program is solved again (warm-started from the incumbent). Each program is a
    relaxation of the whole one, so its bound stays valid, and an answer that fits everywhere is optimal for
    the whole program when it is for the relaxation. ``timings``: where the build time and the rounds go
    (none: kept nowhere). ``first_work``: the backend's work begun on the first program (`begin_whole`).
    """
    timings = {} if timings is None else timings
    backend = get_backend(settings.backend)
    needed = binding_memory_times(core)
    active = np.zeros(0, dtype=np.int64)
    if incumbent is not None and len(needed) and not backend.separates_memory:
        near = memory_times_over(core, incumbent, int(policy.LAZY_MEMORY_START * (core.usage_limit or 0)))
        active = np.intersect1d(near, needed)
    timings.setdefault("build", 0.0)
    rounds = 0
    bound = -math.inf  # every round's program is a relaxation of the whole one: its bound holds
    while True:
        if first_work is not None and rounds == 0:
            program = first_work.program
        else:
            phase = time.perf_counter()
            program = build_program(core, memory_times=active if len(needed) else np.zeros(0, np.int64))
            timings["build"] += time.perf_counter() - phase
        result = backend.solve(
            program,
            BackendLimits(
                max(0.5, deadline - time.perf_counter()), settings.threads, relative_gap=settings.relative_gap
            ),
            warm_start=incumbent,
            progress=lambda _t, cost, bound: settings.on_progress(cost, bound),
            started=first_work if rounds == 0 else None,
        )
        rounds += 1
        bound = max(bound, result.bound)
        result = dataclasses.replace(proven_only(result, program), bound=bound)
        if result.assignment is None or core.usage_limit is None:
            break
        violated = memory_times_over(core, result.assignment, core.usage_limit)
        if len(violated) == 0:
            break
        log.info("memory rows: %d steps over the limit after round %d; adding them", len(violated), rounds)
        active = np.union1d(active, violated)
        if time.perf_counter() >= deadline - 0.5:
            result = BackendResult.nothing(result.seconds, NO_SOLUTION, result.bound)
            break
    timings["memory_rounds"] = float(rounds)
    return result, program.num_variables, program.num_constraints


def restricted_solver(settings: BackendSettings) -> RestrictedSolver:
    """`solve_whole` as `solver.large.pruned` calls it on a restricted program: its answer alone, nothing
    reported, nothing timed."""

    def solve_restricted(
        restricted: CompactProblem, start: np.ndarray | None, deadline: float
    ) -> np.ndarray | None:
        result, _variables, _constraints = solve_whole(restricted, settings, start, deadline)
        return result.assignment

    return solve_restricted


def proven_only(result: BackendResult, program: IntegerProgram) -> BackendResult:
    """A backend stopped by a relative gap may call its answer optimal: it is only feasible unless the bound
    meets it."""
    if result.status != OPTIMAL:
        return result
    if result.objective - result.bound <= closing_gap(program, result.objective):
        return result
    return dataclasses.replace(result, status=FEASIBLE)
