"""What one solve's phases share: the options asked for, the time budget, the best found so far.

`SolveContext` is made once after the reductions (`solver.solve`) and handed to every phase, which reads the
problem, the path and the budget from it and leaves its answers, bound and timings in it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from solver import policy
from solver.backends.base import BackendResult, Started
from solver.bounds.lagrangian_branch import BranchResult
from solver.compact import CompactProblem
from solver.parallel import ForkedSearch
from solver.path import Mode, SolvePath
from solver.problem import Problem
from solver.reductions import Reduced

#: Progress events: (phase, seconds since start, incumbent cost or inf, bound or -inf).
ProgressCallback = Callable[[str, float, float, float], None]


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """How `solver.solve.solve` solves: its backend, its limits and what its caller needs of the answer."""

    backend: str = "auto"
    """``cbc``, ``highs``, ``cpsat``, ``heuristic`` (no exact backend) or ``auto`` (the path chooses)."""
    time_limit: float = 60.0
    """Seconds for the whole solve, reductions included."""
    threads: int = 2
    seed: int = 0
    """The heuristic's random seed."""
    use_reductions: bool = True
    """Apply the optimum-keeping reductions (`solver.reductions`) first."""
    heuristic_share: float | None = None
    """The heuristic's share of the time before a backend's; None: by the problem's size
    (`solver.path.heuristic_share`)."""
    relative_gap: float = 0.0
    """Every stage may stop once its answer is proven within this share of the optimum."""
    cutoff: float | None = None
    """Answers costing more are of no use to the caller: once a bound proves none costs less, stop."""
    explain_infeasible: bool = True
    """Where no assignment fits, name the smallest reachable peak (its own program), not only a bound."""


@dataclass
class Budget:
    """The clock: when the solve started, and the deadlines of the phases after the reductions."""

    started: float
    begun: float
    """When the phases after the reductions began."""
    left: float
    """The time they share: what the limit left then, never less than `policy.MIN_LEFT_SHARE` of it."""
    bound_deadline: float
    """When the search stops and the bound's time begins."""
    work_deadline: float
    """When the backends stop (the bound's own share kept after it; the priced phases move it to
    ``bound_deadline``: their ascent already took it)."""

    @classmethod
    def after_reductions(cls, started: float, time_limit: float, path: SolvePath) -> Budget:
        """Every phase's share is of the time left now, after the reductions: on a plan search's short limits
        the reductions of a large problem take much of it, and shares of the whole limit would overrun it."""
        deadline = started + time_limit
        now = time.perf_counter()
        left = max(deadline - now, policy.MIN_LEFT_SHARE * time_limit)
        bound_deadline = now + (1.0 - policy.FINISH_RESERVE) * left
        kept = 0.0 if path.mode == Mode.FULL and not path.tight else policy.BOUND_SHARE * left
        return cls(started, now, left, bound_deadline, bound_deadline - kept)


class Tracker:
    """Best incumbent and bound seen so far, forwarded to the progress callback."""

    def __init__(self, started: float, callback: ProgressCallback | None) -> None:
        self.started = started
        self.callback = callback
        self.best = math.inf
        self.bound = -math.inf
        self.first_solution: float | None = None

    def incumbent(self, phase: str, cost: float) -> None:
        self.update(phase, cost, -math.inf)

    def update(self, phase: str, cost: float, bound: float) -> None:
        now = time.perf_counter() - self.started
        if math.isfinite(cost) and self.first_solution is None:
            self.first_solution = now
        improved = cost < self.best or bound > self.bound
        self.best = min(self.best, cost)
        self.bound = max(self.bound, bound)
        if self.callback is not None and (improved or phase == "final"):
            self.callback(phase, now, self.best, self.bound)


class Stagnation:
    """Before a backend takes the whole program, the heuristic only needs a good warm start: it stops once it
    has gone `policy.HEURISTIC_PATIENCE` times as long as its last improvement took (at least ``quiet``
    seconds) without improving by `policy.HEURISTIC_MIN_GAIN` or more."""

    def __init__(self, started: float, quiet: float) -> None:
        self.started = started
        self.last = started
        self.cost = math.inf
        self.quiet = quiet

    def improved(self, cost: float) -> None:
        if cost < self.cost - policy.HEURISTIC_MIN_GAIN * abs(cost):
            self.last, self.cost = time.perf_counter(), cost

    def stalled(self) -> bool:
        now = time.perf_counter()
        return now - self.last > max(self.quiet, policy.HEURISTIC_PATIENCE * (self.last - self.started))

    def quiet_now(self) -> bool:
        """No improvement for the last ``quiet`` seconds."""
        return time.perf_counter() - self.last > self.quiet


@dataclass
class SolveContext:
    """One solve: its inputs, path and budget, and what its phases have found (costs and bounds of the
    compact problem, without the reductions' ``constant``)."""

    problem: Problem
    reduced: Reduced
    core: CompactProblem
    """The compacted reduced problem every phase works on."""
    options: SolveOptions
    path: SolvePath
    budget: Budget
    tracker: Tracker
    timings: dict[str, float]
    searched: BranchResult | None = None
    """The Lagrangian search's result, where it ran."""
    known_bound: float = -math.inf
    """The best bound proven so far."""
    incumbent: np.ndarray | None = None
    """The answer the next phase starts from."""
    candidates: list[np.ndarray] = field(default_factory=list)
    """Every answer worth re-costing at the end."""
    first_work: Started | None = None
    """The backend's first work on the whole program, begun before the heuristic."""
    background: list[ForkedSearch] = field(default_factory=list)
    """The heuristic going on on another core during large neighbourhood search."""
    exact: BackendResult | None = None
    """The backend's result on the whole program."""
    variables: int = 0
    constraints: int = 0
    bound: float = -math.inf
    """The final bound, the reductions' constant included (set by the last phase)."""
    label: str = ""
    """The backend as the result names it (set by the last phase)."""

    @property
    def constant(self) -> float:
        """What the reductions took out of every cost."""
        return self.reduced.constant

    def report(self, phase: str) -> Callable[[float, np.ndarray], None]:
        """An ``on_incumbent`` callback reporting a compact cost to the tracker as ``phase``."""
        return lambda cost, _assignment: self.tracker.incumbent(phase, cost + self.constant)
