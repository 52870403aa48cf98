"""Search by regions: an exact backend re-optimises one region of the problem at a time.

Each round a `RegionPicker` picks a set of free super nodes; every node outside it is fixed at the incumbent
(`fixed_outside`: the fixed nodes' edges into the region become node costs, their memory a constant profile
carried by one background node), so the region's program is small and exact, and the backend solves it
warm-started from the incumbent. Its answer is taken when it is strictly cheaper and fits the memory limit
(checked on the whole problem, `adopt_region`), so the result is never worse than the incumbent and always
feasible. The pickers: `solver.large.lns` (regions grown along the graph) and `solver.large.peak` (regions
around the steps where the memory limit binds, with a budget that adapts).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from solver.backends import get_backend
from solver.backends.base import BackendLimits, BackendResult
from solver.compact import CompactProblem
from solver.evaluate import interval_profile
from solver.ilp import IntegerProgram

#: Called with each answer the search takes: (its cost, the assignment).
OnIncumbent = Callable[[float, np.ndarray], None]
#: Asked before each region: an answer found elsewhere meanwhile (a search on another core), or None.
Outside = Callable[[], tuple[float, np.ndarray] | None]


class RegionPicker(ABC):
    """Which region of `problem` the search solves next, as which program, with how much time, and when it
    stops."""

    problem: CompactProblem

    #: The backend's time per region; no region starts within `margin` seconds of the deadline, and the
    #: search stops once a region's time (which keeps `reserve` seconds before the deadline) is `reserve` or
    #: less.
    seconds: float
    reserve: float
    margin: float
    #: True when a region's time is measured after its program is built (building counts against it).
    timed_after_build: bool = False

    def goes_on(self, cost: float) -> bool:
        """Whether the search takes another region at an incumbent of ``cost`` (time permitting)."""
        return True

    @abstractmethod
    def pick(self, current: np.ndarray) -> np.ndarray:
        """The next region around the incumbent ``current``: free super nodes, sorted."""

    @abstractmethod
    def program(self, sub: CompactProblem) -> IntegerProgram:
        """The program the backend solves for a region's problem ``sub`` (`fixed_outside`)."""

    def solved(self, region: np.ndarray, result: BackendResult, limit: float, adopted: bool) -> bool:
        """Told how a region went (its time ``limit``, whether its answer was taken); True ends the search."""
        return False


@dataclass(frozen=True)
class Searched:
    """Where a region search ended: the assignment and its cost, regions tried, and improved."""

    assignment: np.ndarray
    cost: float
    regions: int
    improved: int


@dataclass(frozen=True)
class RegionSearch:
    """How a region search runs besides its problem, start and deadline."""

    backend: str = "highs"
    """The exact backend that solves each region's program."""
    seed: int = 0
    """The pickers' random seed."""
    on_incumbent: OnIncumbent | None = None
    """Told each answer the search takes."""
    outside: Outside | None = None
    """Asked before each region for an answer found elsewhere (`take_offered`)."""


def search_regions(
    picker: RegionPicker, incumbent: np.ndarray, deadline: float, search: RegionSearch
) -> Searched:
    """Improve `incumbent` of the picker's problem region by region, regions from ``picker``, until
    `deadline` (a `time.perf_counter()` value) or the picker stops, as ``search`` says."""
    backend, on_incumbent, outside = search.backend, search.on_incumbent, search.outside
    problem = picker.problem
    solver = get_backend(backend)
    current = np.asarray(incumbent, dtype=np.int64).copy()
    cost = problem.cost(current)
    free = np.flatnonzero(problem.strategy_counts > 1)
    regions = improved = 0
    while len(free) and time.perf_counter() < deadline - picker.margin and picker.goes_on(cost):
        current, cost = take_offered(problem, current, cost, outside)
        region = picker.pick(current)
        built = _region_program(picker, region, current) if picker.timed_after_build else None
        limit = min(picker.seconds, deadline - time.perf_counter() - picker.reserve)
        if limit <= picker.reserve:
            break
        program, warm = built if built is not None else _region_program(picker, region, current)
        result = solver.solve(program, BackendLimits(limit, 1), warm_start=warm)
        regions += 1
        adopted = adopt_region(problem, current, cost, region, result.assignment)
        if adopted is not None:
            current, cost = adopted
            improved += 1
            if on_incumbent is not None:
                on_incumbent(cost, current)
        if picker.solved(region, result, limit, adopted is not None):
            break
    return Searched(current, cost, regions, improved)


def _region_program(
    picker: RegionPicker, region: np.ndarray, current: np.ndarray
) -> tuple[IntegerProgram, np.ndarray]:
    """The program of ``region`` with every other node fixed at ``current``, and its warm start."""
    sub, warm = fixed_outside(picker.problem, region, current)
    return picker.program(sub), warm


def fixed_outside(
    problem: CompactProblem, region: np.ndarray, assignment: np.ndarray
) -> tuple[CompactProblem, np.ndarray]:
    """The region free, everything else fixed; node ``len(region)`` carries the fixed memory."""
    local = np.full(problem.num_nodes, -1, dtype=np.int64)
    local[region] = np.arange(len(region))
    costs = [problem.costs[k].copy() for k in region.tolist()]
    edge_nodes, edge_costs = [], []
    for e in {e for k in region.tolist() for e in problem.incident_edges[k]}:
        a, b = problem.edge_nodes[e]
        matrix = problem.edge_costs[e]
        if local[a] >= 0 and local[b] >= 0:
            edge_nodes.append((local[a], local[b]))
            edge_costs.append(matrix)
        elif local[a] >= 0:
            costs[local[a]] = costs[local[a]] + matrix[:, assignment[b]]
        else:
            costs[local[b]] = costs[local[b]] + matrix[assignment[a], :]
    background = len(region)
    costs.append(np.zeros(1))
    inside = local[problem.term_node] >= 0
    term_usages = [
        usage if inside[t] else usage[assignment[k] : assignment[k] + 1]
        for t, (k, usage) in enumerate(zip(problem.term_node.tolist(), problem.term_usages, strict=True))
    ]
    sub = CompactProblem(
        costs=costs,
        edge_nodes=np.array(edge_nodes, dtype=np.int64).reshape(-1, 2),
        edge_costs=edge_costs,
        term_node=np.where(inside, local[problem.term_node], background),
        term_intervals=problem.term_intervals,
        term_usages=term_usages,
        usage_limit=problem.usage_limit,
        node_of=np.arange(len(costs), dtype=np.int64),
    )
    return sub, np.append(assignment[region], 0)


def adopt_region(
    problem: CompactProblem,
    current: np.ndarray,
    cost: float,
    region: np.ndarray,
    answer: np.ndarray | None,
) -> tuple[np.ndarray, float] | None:
    """``current`` with its ``region`` nodes set from a region program's ``answer`` (its first ``len(region)``
    entries), and that cost, when it costs less than ``cost`` and fits the memory limit; else None."""
    if answer is None:
        return None
    candidate = current.copy()
    candidate[region] = answer[: len(region)]
    return _cheaper_and_fitting(problem, candidate, cost)


def take_offered(
    problem: CompactProblem,
    current: np.ndarray,
    cost: float,
    outside: Outside | None,
) -> tuple[np.ndarray, float]:
    """The answer ``outside`` offers (a search on another core) with its cost when it is cheaper than
    ``current`` and fits, else ``current`` and ``cost``."""
    offered = outside() if outside is not None else None
    if offered is None:
        return current, cost
    taken = _cheaper_and_fitting(problem, np.array(offered[1], dtype=np.int64), cost)
    return taken if taken is not None else (current, cost)


def _cheaper_and_fitting(
    problem: CompactProblem, candidate: np.ndarray, cost: float
) -> tuple[np.ndarray, float] | None:
    """``candidate`` and its cost when that is below ``cost`` and it fits the memory limit, else None."""
    candidate_cost = problem.cost(candidate)
    if candidate_cost < cost and fits(problem, candidate):
        return candidate, candidate_cost
    return None


def fits(problem: CompactProblem, assignment: np.ndarray) -> bool:
    """Memory check of a full assignment (the region's program already enforces it; this guards it)."""
    if problem.usage_limit is None or len(problem.term_node) == 0:
        return True
    used = np.array(
        [u[assignment[k]] for k, u in zip(problem.term_node.tolist(), problem.term_usages, strict=True)],
        dtype=np.int64,
    )
    _, usage = interval_profile(problem.term_intervals[:, 0], problem.term_intervals[:, 1], used)
    return bool(usage.max(initial=0) <= problem.usage_limit) and math.isfinite(problem.cost(assignment))
