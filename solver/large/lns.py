"""Large neighbourhood search: an exact backend re-optimises one region of the graph at a time.

When the whole program is too large for a backend, the incumbent is improved region by region: a
connected set of free super nodes grown breadth-first from a random root stays free, every other node is
fixed to its incumbent strategy. Fixed nodes fold into the region as constants (their edges into it become
node costs, their memory a constant profile carried by one background node), so the sub-program is small
and exact; an improvement is accepted only when the backend's answer is strictly cheaper. The result is
never worse than the incumbent it started from and always feasible.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from solver.backends import get_backend
from solver.backends.base import OPTIMAL
from solver.compact import CompactProblem
from solver.evaluate import interval_profile
from solver.ilp import build_program

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
    backend: str = "highs",
    seed: int = 0,
    region_nodes: int = REGION_NODES,
    on_incumbent: Callable[[float, np.ndarray], None] | None = None,
    outside: Callable[[], tuple[float, np.ndarray] | None] | None = None,
) -> tuple[np.ndarray, LnsStats]:
    """Improve `incumbent` region by region until `deadline` (a `time.perf_counter()` value).

    ``outside`` (asked before each region): an answer found elsewhere meanwhile (a search on another core),
    taken when it is cheaper and fits."""
    rng = np.random.default_rng(seed)
    solver = get_backend(backend)
    current = np.asarray(incumbent, dtype=np.int64).copy()
    cost = problem.cost(current)
    free = np.flatnonzero(problem.strategy_counts > 1)
    regions = improved = 0
    while len(free) and time.perf_counter() < deadline - 0.5:
        current, cost = take_offered(problem, current, cost, outside)
        region = _grow_region(problem, int(rng.choice(free)), region_nodes)
        sub, warm = fixed_outside(problem, region, current)
        program = build_program(sub)
        limit = min(REGION_SECONDS, deadline - time.perf_counter() - 0.2)
        if limit <= 0.2:
            break
        result = solver.solve(program, time_limit=limit, threads=1, warm_start=warm)
        regions += 1
        adopted = adopt_region(problem, current, cost, region, result.assignment)
        if adopted is not None:
            current, cost = adopted
            improved += 1
            if on_incumbent is not None:
                on_incumbent(cost, current)
        if len(region) == len(free) and result.status == OPTIMAL:
            break  # the region was the whole problem and its answer is proven: no other region can improve it
    return current, LnsStats(regions, improved, cost)


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
    outside: Callable[[], tuple[float, np.ndarray] | None] | None,
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
