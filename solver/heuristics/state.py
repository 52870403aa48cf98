"""Flat arrays of a `CompactProblem` for the numba heuristic, and the mutable search state.

`Flat` holds the problem once, CSR-style: strategies of node ``v`` at ``noff[v]:noff[v+1]``; the
neighbours of ``v`` at ``adj_off[v]:adj_off[v+1]`` (with the edge joining them); edge ``e`` joins
``ea[e] < eb[e]`` with cost ``ecost[eoff[e] + sa * ncount[eb[e]] + sb]``; the memory terms of ``v`` at
``nterm_off[v]:nterm_off[v+1]``, term ``q`` covering the compressed time points ``[tlo[q], thi[q])`` with
usage ``tuse[tuoff[q] + s]``. Time points are compressed to the distinct interval starts, the only
places where the usage profile can peak. Forbidden costs become ``forb``, a finite value above every
possible finite total, so that the kernels can count and trade them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from solver.compact import CompactProblem
from solver.heuristics.kernels import seg_build

#: Usage limit standing for "no limit".
NO_LIMIT = 1 << 62


class Flat(NamedTuple):
    """The problem as flat arrays (see the module docstring)."""

    ncount: np.ndarray
    noff: np.ndarray
    ncost: np.ndarray
    nprice: np.ndarray  # per strategy: a memory price added to the node cost (mutable)
    adj_off: np.ndarray
    adj_other: np.ndarray
    adj_edge: np.ndarray
    ea: np.ndarray
    eb: np.ndarray
    eoff: np.ndarray
    ecost: np.ndarray
    nterm_off: np.ndarray
    tlo: np.ndarray
    thi: np.ndarray
    tuoff: np.ndarray
    tuse: np.ndarray
    num_points: int
    limit: int
    forb: float


class State(NamedTuple):
    """An assignment, its usage segment tree and its objective; ``best`` is the best feasible one seen."""

    assign: np.ndarray
    seg_t: np.ndarray
    seg_d: np.ndarray
    seg_size: int
    nviol: np.ndarray  # int64[1]: forbidden choices made
    finite: np.ndarray  # float64[1]: sum of the finite costs chosen
    price: np.ndarray  # float64[1]: sum of the memory prices chosen
    best: np.ndarray
    best_cost: np.ndarray  # float64[1]
    step: np.ndarray  # int64[1]: moves made


class Work(NamedTuple):
    """Scratch arrays of the tree-DP move, allocated once."""

    stamp: np.ndarray
    tmark: np.ndarray
    rmark: np.ndarray
    emark: np.ndarray
    cmark: np.ndarray
    tree: np.ndarray
    parent: np.ndarray
    pedge: np.ndarray
    upos: np.ndarray
    apos: np.ndarray
    choice: np.ndarray
    cand: np.ndarray
    cand_parent: np.ndarray
    cand_edge: np.ndarray
    ubuf: np.ndarray
    abuf: np.ndarray
    changed: np.ndarray
    newval: np.ndarray
    oldval: np.ndarray


def flatten(problem: CompactProblem) -> Flat:
    """Convert ``problem`` once into the arrays the kernels read."""
    ncount = problem.strategy_counts.astype(np.int64)
    n = len(ncount)
    noff = _offsets(ncount)
    ncost = np.concatenate(problem.costs).astype(np.float64) if n else np.zeros(0)
    m = problem.num_edges
    ea = problem.edge_nodes[:, 0].astype(np.int64) if m else np.zeros(0, np.int64)
    eb = problem.edge_nodes[:, 1].astype(np.int64) if m else np.zeros(0, np.int64)
    ecost = np.concatenate([c.ravel() for c in problem.edge_costs]).astype(np.float64) if m else np.zeros(0)
    eoff = _offsets(np.array([c.size for c in problem.edge_costs], dtype=np.int64))[:-1]
    forb = _forbidden_value(problem)
    ncost[~np.isfinite(ncost)] = forb
    ecost[~np.isfinite(ecost)] = forb
    adj_off, adj_other, adj_edge = _adjacency(n, ea, eb)
    limit = NO_LIMIT if problem.usage_limit is None else int(problem.usage_limit)
    terms = _terms(problem, noff, with_terms=problem.usage_limit is not None)
    return Flat(
        ncount, noff, ncost, np.zeros(len(ncost)), adj_off, adj_other, adj_edge, ea, eb, eoff, ecost,
        *terms, limit, forb,
    )  # fmt: skip


def _offsets(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _forbidden_value(problem: CompactProblem) -> float:
    """A cost above any finite total: 4 x (sum of every node's and edge's largest finite entry) + 1."""
    total = 1.0
    for values in [*problem.costs, *problem.edge_costs]:
        finite = values[np.isfinite(values)]
        if finite.size:
            total += float(finite.max())
    return 4.0 * total


def _adjacency(n: int, ea: np.ndarray, eb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR lists of (neighbour, edge) per node."""
    ends = np.concatenate([ea, eb])
    others = np.concatenate([eb, ea])
    edges = np.concatenate([np.arange(len(ea)), np.arange(len(ea))]).astype(np.int64)
    order = np.argsort(ends, kind="stable")
    adj_off = _offsets(np.bincount(ends, minlength=n).astype(np.int64))
    return adj_off, others[order].astype(np.int64), edges[order]


def _terms(
    problem: CompactProblem, noff: np.ndarray, with_terms: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Memory terms grouped by node, on compressed time points."""
    n = len(noff) - 1
    term_node = problem.term_node.astype(np.int64) if with_terms else np.zeros(0, np.int64)
    intervals = problem.term_intervals.reshape(-1, 2)[: len(term_node)]
    order = np.argsort(term_node, kind="stable")
    term_node = term_node[order]
    intervals = intervals[order]
    times = np.unique(intervals[:, 0])
    tlo = np.searchsorted(times, intervals[:, 0], side="left").astype(np.int64)
    thi = np.searchsorted(times, intervals[:, 1], side="left").astype(np.int64)
    usages = [np.asarray(problem.term_usages[i], dtype=np.int64) for i in order.tolist()]
    tuse = np.concatenate(usages) if usages else np.zeros(0, np.int64)
    tuoff = _offsets(np.array([len(u) for u in usages], dtype=np.int64))[:-1]
    nterm_off = _offsets(np.bincount(term_node, minlength=n).astype(np.int64))
    return nterm_off, tlo, thi, tuoff, tuse, len(times)


def usage_points(flat: Flat, assign: np.ndarray) -> np.ndarray:
    """Total chosen usage at every compressed time point."""
    term_node = np.repeat(np.arange(len(flat.ncount)), np.diff(flat.nterm_off))
    used = flat.tuse[flat.tuoff + assign[term_node]]
    diff = np.zeros(flat.num_points + 1, dtype=np.int64)
    np.add.at(diff, flat.tlo, used)
    np.add.at(diff, flat.thi, -used)
    return np.cumsum(diff[:-1])


def min_usage_assignment(flat: Flat) -> np.ndarray:
    """Each node's least-usage strategy (ties: cheapest); its profile is the pointwise minimum."""
    n = len(flat.ncount)
    total_use = np.zeros(len(flat.ncost), dtype=np.float64)
    for v in np.flatnonzero(np.diff(flat.nterm_off)).tolist():
        for q in range(flat.nterm_off[v], flat.nterm_off[v + 1]):
            start = flat.tuoff[q]
            total_use[flat.noff[v] : flat.noff[v + 1]] += flat.tuse[start : start + flat.ncount[v]]
    assign = np.zeros(n, dtype=np.int64)
    for v in range(n):
        lo, hi = flat.noff[v], flat.noff[v + 1]
        assign[v] = int(np.lexsort((flat.ncost[lo:hi], total_use[lo:hi]))[0])
    return assign


def new_state(flat: Flat, assign: np.ndarray) -> State:
    """The search state of ``assign``: segment tree built, objective computed exactly."""
    size = 1
    while size < max(flat.num_points, 1):
        size *= 2
    seg_t, seg_d = seg_build(usage_points(flat, assign), size)
    nviol, finite = objective_parts(flat, assign)
    price = float(flat.nprice[flat.noff[:-1] + assign].sum())
    return State(
        assign.copy(), seg_t, seg_d, size, np.array([nviol]), np.array([finite]), np.array([price]),
        assign.copy(), np.array([np.inf]), np.zeros(1, np.int64),
    )  # fmt: skip


def objective_parts(flat: Flat, assign: np.ndarray) -> tuple[int, float]:
    """(forbidden choices, sum of finite costs) of a full assignment."""
    node_values = flat.ncost[flat.noff[:-1] + assign]
    edge_values = flat.ecost[flat.eoff + assign[flat.ea] * flat.ncount[flat.eb] + assign[flat.eb]]
    values = np.concatenate([node_values, edge_values])
    bad = values >= flat.forb
    return int(bad.sum()), float(values[~bad].sum())


def new_work(flat: Flat, max_nodes: int) -> Work:
    """Scratch space for trees of up to ``max_nodes`` nodes."""
    n = len(flat.ncount)
    max_s = int(flat.ncount.max()) if n else 1
    cap = max(max_nodes * max_s, 4 * max_s)
    ints = lambda size: np.zeros(size, dtype=np.int64)  # noqa: E731
    return Work(
        stamp=ints(1), tmark=ints(n), rmark=ints(n), emark=ints(len(flat.ea)), cmark=ints(n),
        tree=ints(max_nodes + 1),
        parent=ints(max_nodes + 1), pedge=ints(max_nodes + 1), upos=ints(max_nodes + 2),
        apos=ints(max_nodes + 1), choice=ints(max_nodes + 1), cand=ints(len(flat.adj_other) + 1),
        cand_parent=ints(len(flat.adj_other) + 1), cand_edge=ints(len(flat.adj_other) + 1),
        ubuf=np.zeros(cap), abuf=ints(cap), changed=ints(max_nodes + 1), newval=ints(max_nodes + 1),
        oldval=ints(max_nodes + 1),
    )  # fmt: skip
