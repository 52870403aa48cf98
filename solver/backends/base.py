"""What every backend takes and returns."""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from solver.ilp import IntegerProgram

#: Called with (seconds since the backend started, incumbent objective or inf, proven bound or -inf).
ProgressSink = Callable[[float, float, float], None]

OPTIMAL = "optimal"
FEASIBLE = "feasible"
INFEASIBLE = "infeasible"
NO_SOLUTION = "no_solution_in_time"


@dataclass(frozen=True)
class BackendResult:
    """A backend's answer on the program (objective and bound include the program's constant)."""

    status: str
    assignment: np.ndarray | None
    objective: float
    bound: float
    seconds: float
    first_solution_seconds: float | None = None

    @staticmethod
    def nothing(seconds: float, status: str = NO_SOLUTION, bound: float = -math.inf) -> BackendResult:
        return BackendResult(status, None, math.inf, bound, seconds, None)


class Started:
    """Work a backend began on a program in a background thread (`Backend.begin`), before the caller had a
    warm start for it: the caller runs its heuristic meanwhile and hands this to `Backend.solve`."""

    def __init__(self, program: IntegerProgram, work: Callable[[], Any]) -> None:
        self.program = program
        self._work = work
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="autoshard-backend-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as error:  # re-raised in the caller's thread by `result`
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        """What the work returned, once it has (its exception, if it raised one)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass(frozen=True)
class BackendLimits:
    """When a backend stops: after ``time_limit`` seconds on ``threads`` threads, or once its answer is proven
    within ``relative_gap`` of its bound."""

    time_limit: float
    threads: int
    relative_gap: float = 0.0


@dataclass(frozen=True)
class SolveCall:
    """What `Backend.solve` was asked besides the program, and when it began (a `time.perf_counter()` value,
    taken once the program was found not to be empty)."""

    time_limit: float
    threads: int
    warm_start: np.ndarray | None
    progress: ProgressSink | None
    relative_gap: float
    started: Started | None
    begun: float

    def elapsed(self) -> float:
        """Seconds since the call began."""
        return time.perf_counter() - self.begun


class Backend(ABC):
    """An exact solver: honours the time limit and thread count, may start from a warm assignment, and may
    stop once its answer is within ``relative_gap`` of its bound.

    `solve` answers a program without variables itself (`empty_program_result`) and starts the clock; each
    backend implements `_solve`, what follows."""

    name: str
    #: True when the backend checks its answers -- and LP solutions -- against every row of the program's
    #: `MemoryProfile` and adds the rows they violate itself: the program can then start without memory rows.
    separates_memory: bool = False

    def begin(self, program: IntegerProgram, time_limit: float, threads: int) -> Started | None:
        """Start the part of solving ``program`` that needs no warm start in a background thread, on one
        core (the caller's heuristic uses another); None when the backend has no such part."""
        return None

    def solve(
        self,
        program: IntegerProgram,
        limits: BackendLimits,
        warm_start: np.ndarray | None = None,
        progress: ProgressSink | None = None,
        started: Started | None = None,
    ) -> BackendResult:
        """Solve ``program`` within ``limits`` (``started``: what `begin` returned for this same program, if
        anything)."""
        if (empty := empty_program_result(program)) is not None:
            return empty
        begun = time.perf_counter()
        call = SolveCall(
            limits.time_limit, limits.threads, warm_start, progress, limits.relative_gap, started, begun
        )
        return self._solve(program, call)

    @abstractmethod
    def _solve(self, program: IntegerProgram, call: SolveCall) -> BackendResult:
        """Solve ``program``, which has variables, as ``call`` asks."""


def integral_objective(program: IntegerProgram) -> bool:
    """True when every objective coefficient and the constant are integers (gaps below 1 then close)."""
    return (
        bool(np.all(program.objective == np.round(program.objective)))
        and float(program.constant).is_integer()
    )


def closing_gap(program: IntegerProgram, objective: float) -> float:
    """The difference between an answer and a bound that proves the answer optimal: below 1 for integral
    objectives, else rounding noise."""
    return 0.999 if integral_objective(program) else 1e-9 * max(1.0, abs(objective))


def empty_program_result(program: IntegerProgram) -> BackendResult | None:
    """The answer for a program without variables (every node constant), which some solvers refuse."""
    if program.num_variables:
        return None
    profile = program.memory_profile
    overflows = profile is not None and len(profile.over(np.zeros(0))) > 0
    if np.any(program.row_lower > 1e-9) or np.any(program.row_upper < -1e-9) or overflows:
        return BackendResult.nothing(0.0, INFEASIBLE, math.inf)
    assignment = np.zeros(len(program.x_offset), dtype=np.int64)
    return BackendResult(OPTIMAL, assignment, program.constant, program.constant, 0.0, 0.0)
