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
    """An exact solver: honours the time limit and thread count, may start from a warm assignment."""

    name: str

    def solve(
        self,
        program: IntegerProgram,
        time_limit: float,
        threads: int,
        warm_start: np.ndarray | None = None,
        progress: ProgressSink | None = None,
    ) -> BackendResult: ...


def integral_objective(program: IntegerProgram) -> bool:
    """True when every objective coefficient and the constant are integers (gaps below 1 then close)."""
    return bool(np.all(program.objective == np.round(program.objective))) and float(program.constant).is_integer()
