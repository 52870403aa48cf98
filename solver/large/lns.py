"""Large neighbourhood search: an exact backend re-optimises one region of the graph at a time.

When the whole program is too large for a backend, the incumbent is improved region by region
(`solver.large.regions`): a connected set of free super nodes grown breadth-first from a random root stays
free, every other node is fixed to its incumbent strategy. Fixed nodes fold into the region as constants
(their edges into it become node costs, their memory a constant profile carried by one background node), so
the sub-program is small and exact; an improvement is accepted only when the backend's answer is strictly
cheaper. The result is never worse than the incumbent it started from and always feasible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.backends.base import OPTIMAL, BackendResult
from solver.compact import CompactProblem
from solver.ilp import IntegerProgram, build_program
from solver.large.regions import RegionPicker, RegionSearch, search_regions

#: Free super nodes per region, and the backend's time per region.
REGION_NODES = 400
REGION_SECONDS = 8.0


@dataclass(frozen=True)
class LnsStats:
    """What the search did: regions tried, improved, and the cost it reached."""

    regions: int
    improved: int
    cost: float


def lns_improve(
    problem: CompactProblem,
    incumbent: np.ndarray,
    deadline: float,
    search: RegionSearch | None = None,
    region_nodes: int = REGION_NODES,
) -> tuple[np.ndarray, LnsStats]:
    """Improve `incumbent` region by region until `deadline` (a `time.perf_counter()` value), each region
    ``region_nodes`` free super nodes, as ``search`` says (None: `RegionSearch`'s defaults)."""
    search = search or RegionSearch()
    picker = _GraphRegions(problem, np.random.default_rng(search.seed), region_nodes)
    searched = search_regions(picker, incumbent, deadline, search)
    return searched.assignment, LnsStats(searched.regions, searched.improved, searched.cost)


class _GraphRegions(RegionPicker):
    """Regions of `region_nodes` free super nodes grown from a random one (`_grow_region`), timed with their
    program's build; the search ends once a region holding every free node is solved to optimality."""

    reserve, margin = 0.2, 0.5
    timed_after_build = True

    def __init__(self, problem: CompactProblem, rng: np.random.Generator, region_nodes: int) -> None:
        self.problem = problem
        self.rng = rng
        self.region_nodes = region_nodes
        self.seconds = REGION_SECONDS
        self.free = np.flatnonzero(problem.strategy_counts > 1)

    def pick(self, current: np.ndarray) -> np.ndarray:
        return _grow_region(self.problem, int(self.rng.choice(self.free)), self.region_nodes)

    def program(self, sub: CompactProblem) -> IntegerProgram:
        return build_program(sub)

    def solved(self, region: np.ndarray, result: BackendResult, limit: float, adopted: bool) -> bool:
        # the region was the whole problem and its answer is proven: no other region can improve it
        return len(region) == len(self.free) and result.status == OPTIMAL


def _grow_region(problem: CompactProblem, root: int, size: int) -> np.ndarray:
    """Up to `size` free super nodes reached breadth-first from `root`. When its component is exhausted, the
    region goes on from the next free node outside it: memory couples nodes that share no edge, so a region of
    the size asked for is worth more than a connected one, and one as large as the problem is all of it."""
    counts = problem.strategy_counts
    seen = {root}
    order = [root]
    head = 0
    unvisited = iter(np.flatnonzero(counts > 1).tolist())
    while len(order) < size:
        if head == len(order):
            fresh = next((n for n in unvisited if n not in seen), None)
            if fresh is None:
                break
            seen.add(fresh)
            order.append(fresh)
            continue
        node = order[head]
        head += 1
        for e in problem.incident_edges[node]:
            a, b = problem.edge_nodes[e]
            other = int(b if a == node else a)
            if other not in seen and counts[other] > 1:
                seen.add(other)
                order.append(other)
                if len(order) >= size:
                    break
    return np.array(sorted(order), dtype=np.int64)
