"""Answers for programs too large for a backend: TRW-S picks a few strategies per node, a backend solves the
program over those exactly.

TRW-S (`solver.bounds.trws`) ends with a lower bound and, per node, a *belief*: the node's cost plus the
messages into it, an estimate of the best objective with the node at each strategy. On the local-polytope
relaxations of sharding problems (often tight) the optimum's strategies rank near the top of their beliefs,
so the program restricted to each node's `KEEP_PER_NODE` best strategies (plus the incumbent's, so the
incumbent stays an answer) is small -- thousands of strategies instead of tens of thousands, with edge
matrices cut to match -- and goes whole to a backend (`solver.whole.solve_whole`: memory rows and all).
Its answer is an answer of the whole problem; the TRW-S bound is a bound of the whole problem (memory
ignored), so the pair is a certificate.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from solver.bounds.trws import _certify, _prepare_mapped, beliefs, run_trws
from solver.compact import CompactProblem
from solver.errors import InfeasibleError

#: Strategies each node keeps for the restricted program.
KEEP_PER_NODE = 6


class Pruned(NamedTuple):
    assignment: np.ndarray | None
    """Best answer of the restricted program, in the whole problem's strategy indices (None if none)."""
    bound: float
    """TRW-S's proven lower bound on the whole problem (memory ignored), ``-inf`` if it did not run."""
    kept_strategies: int


def pruned_solve(
    problem: CompactProblem,
    incumbent: np.ndarray | None,
    trws_deadline: float,
    deadline: float,
    solve_restricted: Callable[[CompactProblem, np.ndarray | None, float], np.ndarray | None],
    keep_per_node: int = KEEP_PER_NODE,
) -> Pruned:
    """TRW-S until ``trws_deadline`` (or it stalls), then ``solve_restricted(restricted, incumbent,
    deadline)`` on the program over each node's best strategies; its answer is mapped back."""
    prepared = _prepare_mapped(problem)
    if prepared is None:
        return Pruned(None, math.inf, 0)
    constant, arrays, alive, new_id, _ = prepared
    scores = [np.where(a, 0.0, math.inf) for a in alive]
    bound = constant
    if arrays is not None:
        graph, order = arrays
        run = run_trws(graph, order, trws_deadline)
        bound = _certify(graph, run.forward, run.pos, run.msg, constant)
        node_beliefs = beliefs(graph, run.msg)
        for k in range(problem.num_nodes):
            if new_id[k] >= 0:
                scores[k][np.flatnonzero(alive[k])] = node_beliefs[new_id[k]]
    for k in range(problem.num_nodes):
        if new_id[k] < 0:  # no edge: its own cost decides
            scores[k] = np.where(alive[k], problem.costs[k], math.inf)
    keep = _keep(scores, incumbent, keep_per_node)
    kept_count = int(sum(len(k) for k in keep))
    if time.perf_counter() >= deadline:
        return Pruned(None, bound, kept_count)
    return Pruned(solve_over(problem, keep, incumbent, deadline, solve_restricted), bound, kept_count)


def solve_over(
    problem: CompactProblem,
    keep: list[np.ndarray],
    incumbent: np.ndarray | None,
    deadline: float,
    solve_restricted: Callable[[CompactProblem, np.ndarray | None, float], np.ndarray | None],
) -> np.ndarray | None:
    """``solve_restricted(restricted, start, deadline)`` on ``problem`` restricted to the sorted strategies
    ``keep[k]`` of each node (which must hold the ``incumbent``'s, the start), its answer mapped back to
    ``problem``'s strategy indices; None without one."""
    try:
        answer = solve_restricted(restrict(problem, keep), to_restricted(keep, incumbent), deadline)
    except InfeasibleError:  # the kept strategies are forbidden together (or overflow the memory)
        answer = None
    return None if answer is None else from_restricted(keep, answer)


def _keep(scores: list[np.ndarray], incumbent: np.ndarray | None, count: int) -> list[np.ndarray]:
    """Per node, the indices of its ``count`` best-scored finite strategies and the incumbent's, sorted."""
    keep = []
    for k, score in enumerate(scores):
        finite = np.flatnonzero(np.isfinite(score))
        best = finite[np.argsort(score[finite], kind="stable")[:count]]
        if incumbent is not None:
            best = np.union1d(best, [int(incumbent[k])])
        keep.append(np.sort(best).astype(np.int64))
    return keep


def restrict(problem: CompactProblem, keep: list[np.ndarray]) -> CompactProblem:
    """``problem`` with node ``k`` down to the strategies ``keep[k]`` (costs, edges and usages cut alike)."""
    edges = problem.edge_nodes.tolist()
    return dataclasses.replace(
        problem,
        costs=[c[kept] for c, kept in zip(problem.costs, keep, strict=True)],
        edge_costs=[m[keep[a]][:, keep[b]] for m, (a, b) in zip(problem.edge_costs, edges, strict=True)],
        term_usages=[
            u[keep[k]] for u, k in zip(problem.term_usages, problem.term_node.tolist(), strict=True)
        ],
    )


def to_restricted(keep: list[np.ndarray], assignment: np.ndarray | None) -> np.ndarray | None:
    """``assignment`` (``problem``'s strategy indices) in the indices of `restrict` ``(problem, keep)``; None
    without one, or when one of its strategies is not kept."""
    if assignment is None:
        return None
    chosen = assignment.tolist()
    local = [int(np.searchsorted(kept, s)) for kept, s in zip(keep, chosen, strict=True)]
    if any(i >= len(kept) or kept[i] != s for i, kept, s in zip(local, keep, chosen, strict=True)):
        return None
    return np.array(local, dtype=np.int64)


def from_restricted(keep: list[np.ndarray], local: np.ndarray) -> np.ndarray:
    """An answer of `restrict` ``(problem, keep)`` in ``problem``'s strategy indices."""
    return np.array([int(kept[a]) for kept, a in zip(keep, local.tolist(), strict=True)], dtype=np.int64)


__all__ = [
    "KEEP_PER_NODE",
    "Pruned",
    "from_restricted",
    "pruned_solve",
    "restrict",
    "solve_over",
    "to_restricted",
]
