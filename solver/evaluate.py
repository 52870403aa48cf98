"""The independent evaluator: cost of an assignment and whether it breaks a constraint.

Same semantics as the IOPDDL contest's ``Evaluate()``: cost = sum of chosen node costs + sum of chosen edge
costs; the usage at time ``t`` sums the chosen usage of every node with ``start <= t < end``; a solution is
feasible when every cost is finite, no time step exceeds ``usage_limit``, group members agree and pins hold.
It shares no code with any backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from solver.errors import ProblemError
from solver.problem import Problem


@dataclass(frozen=True)
class Evaluation:
    """What an assignment costs and what, if anything, it violates."""

    cost: float
    peak_usage: int
    peak_time: int | None
    violations: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.violations


def check_assignment(problem: Problem, solution: Sequence[int] | np.ndarray) -> np.ndarray:
    """The solution as an int64 array; `ProblemError` when its length or an index is out of range."""
    chosen = np.asarray(solution)
    if chosen.ndim != 1 or len(chosen) != problem.num_nodes:
        raise ProblemError("solution", f"needs one strategy index per node ({problem.num_nodes})")
    if chosen.size and chosen.dtype.kind not in "iu":
        raise ProblemError("solution", "must hold integer strategy indices")
    chosen = chosen.astype(np.int64)
    bad = np.flatnonzero((chosen < 0) | (chosen >= problem.strategy_counts))
    if len(bad):
        i = int(bad[0])
        raise ProblemError(
            f"solution[{i}]", f"strategy {chosen[i]} is outside 0..{problem.strategy_counts[i] - 1}"
        )
    return chosen


def total_cost(problem: Problem, chosen: np.ndarray) -> float:
    """Sum of the chosen node and edge costs (``inf`` when a forbidden choice is made)."""
    node_part = problem.costs[problem.node_offsets[:-1] + chosen]
    if problem.num_edges:
        u, v = problem.edge_nodes[:, 0], problem.edge_nodes[:, 1]
        index = problem.edge_offsets[:-1] + chosen[u] * problem.strategy_counts[v] + chosen[v]
        edge_part = problem.edge_costs[index]
    else:
        edge_part = np.zeros(0)
    return float(math.fsum(node_part.tolist()) + math.fsum(edge_part.tolist()))


def usage_profile(problem: Problem, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, usage): the total usage at each distinct interval start (where every peak occurs)."""
    used = problem.usages[problem.node_offsets[:-1] + chosen]
    return interval_profile(problem.intervals[:, 0], problem.intervals[:, 1], used)


def interval_profile(starts: np.ndarray, ends: np.ndarray, used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, usage) of half-open intervals ``[start, end)`` each using ``used``, at every distinct start."""
    alive = ends > starts
    starts, ends, used = starts[alive], ends[alive], used[alive]
    times = np.unique(starts)
    order_s = np.argsort(starts, kind="stable")
    order_e = np.argsort(ends, kind="stable")
    cum_s = np.concatenate([[0], np.cumsum(used[order_s])])
    cum_e = np.concatenate([[0], np.cumsum(used[order_e])])
    started = cum_s[np.searchsorted(starts[order_s], times, side="right")]
    ended = cum_e[np.searchsorted(ends[order_e], times, side="right")]
    return times, started - ended


def evaluate(problem: Problem, solution: Sequence[int] | np.ndarray) -> Evaluation:
    """Cost and violations of a full assignment (one strategy index per node)."""
    chosen = check_assignment(problem, solution)
    violations: list[str] = []
    cost = total_cost(problem, chosen)
    if math.isinf(cost):
        violations.append("a forbidden (infinite-cost) strategy or strategy pair is chosen")
    times, usage = usage_profile(problem, chosen)
    peak_index = int(np.argmax(usage)) if len(usage) else None
    peak = int(usage[peak_index]) if peak_index is not None else 0
    peak_time = int(times[peak_index]) if peak_index is not None else None
    if problem.usage_limit is not None and peak > problem.usage_limit:
        violations.append(f"usage {peak} exceeds the limit {problem.usage_limit} at time {peak_time}")
    for g, members in enumerate(problem.groups):
        if len(set(chosen[list(members)].tolist())) > 1:
            violations.append(f"group {g} members take different strategies")
    for node, strategy in problem.pins.items():
        if chosen[node] != strategy:
            violations.append(f"node {node} is pinned to strategy {strategy}")
    return Evaluation(cost=cost, peak_usage=peak, peak_time=peak_time, violations=violations)
