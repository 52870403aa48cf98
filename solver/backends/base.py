"""What every backend takes and returns."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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


class Backend(Protocol):
    """An exact solver: honours the time limit and thread count, may start from a warm assignment, and may
    stop once its answer is within ``relative_gap`` of its bound."""

    name: str
    #: True when the backend checks its answers -- and LP solutions -- against every row of the program's
    #: `MemoryProfile` and adds the rows they violate itself: the program can then start without memory rows.
    separates_memory: bool

    def solve(
        self,
        program: IntegerProgram,
        time_limit: float,
        threads: int,
        warm_start: np.ndarray | None = None,
        progress: ProgressSink | None = None,
        relative_gap: float = 0.0,
    ) -> BackendResult: ...


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
