"""A proven lower bound from the pairwise (local-polytope) LP relaxation, by TRW-S dual ascent.

The objective ``sum_k c_k(s_k) + sum_e C_e(s_a, s_b)`` is reparametrised by messages ``m_{e->k}``: node
``k`` gets ``theta_k = c_k + sum_{e incident} m_{e->k}`` and edge ``e`` gets ``C_e - m_{e->a} - m_{e->b}``;
the sum of all factors is unchanged, so for *any* messages and any split of ``theta_k`` into non-negative
shares (``w_k`` kept by the node, ``gamma_k`` lent to each "outgoing" edge, ``w_k + n_out gamma_k = 1``)

    sum_k w_k min theta_k
      + sum_{e out of k} min_{i,j} [gamma_k theta_k(i) + C_e(i,j) - m_{e->a}(i) - m_{e->b}(j)]

is a lower bound on the optimum (``gamma = 0`` is the plain Lagrangian node/edge bound). The messages are
improved by sequential tree-reweighted message passing (TRW-S, Kolmogorov 2006): forward and backward passes
over a node order, ``gamma_k = 1 / max(n_before, n_after)``. At the end of each pass the bound above holds
exactly for the current messages with "outgoing" = the direction of that pass, and is what TRW-S maximises.
The best messages are re-evaluated from scratch at the end, and a rounding margin is subtracted.

Memory limits are ignored (a relaxation, so still a lower bound). Forbidden entries: node strategies that
are ``inf``, or that no finite entry of some edge supports, are removed (arc consistency: exact); the
``inf`` entries left are replaced by a finite cap above any finite total, which only lowers the optimum.
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from solver.compact import CompactProblem

#: Unit roundoff of float64.
_UNIT = 2.0**-53
#: Passes without improvement (relative to `tolerance`) after which the ascent stops.
STALL_PASSES = 20


def dual_bound(problem: CompactProblem, time_limit: float, tolerance: float = 0.0) -> float:
    """A proven lower bound on min sum_k c_k(s_k) + sum_e C_e(s_a, s_b) (memory ignored: still valid).

    Runs TRW-S until `time_limit` seconds have passed (the compile time of the kernels included, about
    a second once they are cached) or the bound has not improved by more than ``tolerance * |bound|`` in
    `STALL_PASSES` consecutive passes. ``inf`` when the problem has no finite assignment (detected by arc
    consistency only).
    """
    started = time.perf_counter()
    deadline = started + max(0.0, time_limit)
    data = _prepare(problem)
    if data is None:
        return math.inf
    constant, arrays = data
    if arrays is None:  # no edge left
        return constant
    graph, order = arrays
    run = run_trws(graph, order, deadline, tolerance)
    return _certify(graph, run.forward, run.pos, run.msg, constant)


class TrwsRun(NamedTuple):
    """The best messages TRW-S reached, with the direction of their pass and the node positions."""

    msg: np.ndarray
    forward: bool
    pos: np.ndarray


def run_trws(graph: _Graph, order: np.ndarray, deadline: float, tolerance: float = 0.0) -> TrwsRun:
    """TRW-S passes until ``deadline`` or `STALL_PASSES` passes without improving by ``tolerance``."""
    n = len(graph.node_off) - 1
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n, dtype=np.int64)
    msg = np.zeros(int(graph.slot_off[-1]), dtype=np.float64)
    scratch = np.zeros(int(np.max(np.diff(graph.node_off))) * 2 + 2, dtype=np.float64)

    best_value = -math.inf
    best_msg = msg.copy()
    best_forward = True
    stall = 0
    forward = True
    while True:
        value = _pass(forward, order, pos, *graph, msg, scratch)
        if value > best_value + tolerance * abs(value) + 1e-300:
            stall = 0
        else:
            stall += 1
        if value > best_value:
            best_value = value
            best_msg[:] = msg
            best_forward = forward
        forward = not forward
        if stall >= STALL_PASSES or time.perf_counter() >= deadline:
            break
    return TrwsRun(best_msg, best_forward, pos)


def beliefs(graph: _Graph, msg: np.ndarray) -> list[np.ndarray]:
    """Per graph node, its cost plus the messages into it (TRW-S's min-marginal estimates)."""
    out = np.empty(int(np.max(np.diff(graph.node_off))), dtype=np.float64)
    result = []
    for i in range(len(graph.node_off) - 1):
        size = _belief(i, graph.node_off, graph.cost, graph.adj_off, graph.slot_off, msg, out)
        result.append(out[:size].copy())
    return result


def _certify(
    graph: _Graph, forward: bool, pos: np.ndarray, msg: np.ndarray, constant: float, extra: float = 0.0
) -> float:
    """The bound of `msg` (better of the TRW-S and plain splits) plus `constant`, minus a rounding margin.

    `extra` is the magnitude of further terms already summed into `constant` (for the margin)."""
    exact, error = _evaluate(graph, forward, False, pos, msg)
    plain, plain_error = _evaluate(graph, forward, True, pos, msg)
    if plain - plain_error > exact - error:
        exact, error = plain, plain_error
    total = exact + constant
    margin = 4.0 * error + 8.0 * _UNIT * (abs(exact) + abs(constant) + extra) + 1e-12 * abs(total)
    return float(total - margin)


# --------------------------------------------------------------------------------------------- preparation
class _Graph(NamedTuple):
    """Flat arrays over the nodes that have an edge; "slots" are (node, incident edge) pairs, CSR by node."""

    node_off: np.ndarray  # int64[n + 1]: strategies of node i are cost[node_off[i]:node_off[i + 1]]
    cost: np.ndarray  # float64
    adj_off: np.ndarray  # int64[n + 1]: slots of node i
    adj_edge: np.ndarray  # int64[2m]: the edge of each slot
    adj_nbr: np.ndarray  # int64[2m]: the other end
    adj_side: np.ndarray  # int64[2m]: 0 if the slot's node indexes the rows of the edge matrix, else 1
    slot_off: np.ndarray  # int64[2m + 1]: the message into the slot's node is msg[slot_off[s]:...]
    edge_off: np.ndarray  # int64[m + 1]: row-major matrix of edge e is edge_c[edge_off[e]:...]
    edge_c: np.ndarray  # float64
    edge_slot: np.ndarray  # int64[m, 2]: the slots of each edge (row side, column side)


def _prepare(problem: CompactProblem):
    """(constant, arrays) for the kernels; arrays is None without edges; None when infeasible."""
    prepared = _prepare_mapped(problem)
    return None if prepared is None else prepared[:2]


def _prepare_mapped(problem: CompactProblem):
    """`_prepare`'s (constant, arrays), then ``alive`` (per node, the strategies arc consistency keeps),
    ``new_id`` (per node, its index in the arrays, -1 for a node without edges) and ``costs`` (per node,
    the costs of its alive strategies); None when infeasible.

    Made once per problem: a solve asks for it up to three times (the Lagrangian search, the pruned solve,
    the memory-priced bound; 0.2 s each on a llama3-8b problem on a 3-D mesh). Every caller gets its own
    copy of the node costs (``graph.cost``: the Lagrangian prices them in place); the rest is shared and
    read only.
    """
    if problem not in _PREPARED:
        _PREPARED[problem] = _prepare_once(problem)
    prepared = _PREPARED[problem]
    if prepared is None or prepared[1] is None:
        return prepared
    constant, (graph, order), alive, new_id, costs = prepared
    return constant, (graph._replace(cost=graph.cost.copy()), order), alive, new_id, costs


_PREPARED: weakref.WeakKeyDictionary[CompactProblem, Any] = weakref.WeakKeyDictionary()


def _prepare_once(problem: CompactProblem):
    n = problem.num_nodes
    costs = [np.asarray(c, dtype=np.float64) for c in problem.costs]
    edges = problem.edge_nodes.tolist()
    matrices = [np.asarray(m, dtype=np.float64) for m in problem.edge_costs]
    alive = [np.isfinite(c) & ~np.isnan(c) for c in costs]
    if any(not a.any() for a in alive):
        return None
    # Arc consistency on the edges that hold an inf: drop strategies no finite entry supports.
    with_inf = [e for e, m in enumerate(matrices) if not np.isfinite(m).all()]
    changed = bool(with_inf)
    while changed:
        changed = False
        for e in with_inf:
            a, b = edges[e]
            finite = np.isfinite(matrices[e]) & alive[a][:, None] & alive[b][None, :]
            row, col = finite.any(axis=1), finite.any(axis=0)
            if (alive[a] & ~row).any():
                alive[a] = alive[a] & row
                changed = True
            if (alive[b] & ~col).any():
                alive[b] = alive[b] & col
                changed = True
            if not alive[a].any() or not alive[b].any():
                return None
    costs = [c[a] for c, a in zip(costs, alive, strict=True)]
    matrices = [m[alive[a]][:, alive[b]] for m, (a, b) in zip(matrices, edges, strict=True)]
    # Cap the inf entries left above any finite total (this only lowers the optimum: still a bound).
    spread = math.fsum(float(c.max() - c.min()) for c in costs)
    peak = max(float(np.max(np.abs(c))) for c in costs) if costs else 0.0
    for m in matrices:
        finite = m[np.isfinite(m)]
        if len(finite):
            spread += float(finite.max() - finite.min())
            peak = max(peak, float(np.max(np.abs(finite))))
    cap = 2.0 * spread + 2.0 * peak + 1.0
    matrices = [np.where(np.isfinite(m), m, cap) for m in matrices]

    degree = np.zeros(n, dtype=np.int64)
    for a, b in edges:
        degree[a] += 1
        degree[b] += 1
    constant = math.fsum(float(c.min()) for c, d in zip(costs, degree.tolist(), strict=True) if d == 0)
    if not edges:
        return constant, None, alive, np.full(n, -1, dtype=np.int64), costs
    # Keep the nodes with an edge, renumbered in their original order (the order TRW-S sweeps).
    keep = np.flatnonzero(degree > 0)
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[keep] = np.arange(len(keep), dtype=np.int64)
    kept_costs = [costs[k] for k in keep.tolist()]
    counts = np.array([len(c) for c in kept_costs], dtype=np.int64)
    node_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    cost = np.concatenate(kept_costs)
    m_edges = len(edges)
    ea = new_id[problem.edge_nodes[:, 0]]
    eb = new_id[problem.edge_nodes[:, 1]]
    nk = len(keep)
    adj_count = np.bincount(ea, minlength=nk) + np.bincount(eb, minlength=nk)
    adj_off = np.concatenate([[0], np.cumsum(adj_count)]).astype(np.int64)
    fill = adj_off[:-1].copy()
    adj_edge = np.empty(2 * m_edges, dtype=np.int64)
    adj_nbr = np.empty(2 * m_edges, dtype=np.int64)
    adj_side = np.empty(2 * m_edges, dtype=np.int64)
    edge_slot = np.empty((m_edges, 2), dtype=np.int64)
    for e in range(m_edges):
        a, b = int(ea[e]), int(eb[e])
        for node, other, side in ((a, b, 0), (b, a, 1)):
            s = fill[node]
            fill[node] += 1
            adj_edge[s], adj_nbr[s], adj_side[s] = e, other, side
            edge_slot[e, side] = s
    slot_size = np.repeat(counts, adj_count)
    slot_off = np.concatenate([[0], np.cumsum(slot_size)]).astype(np.int64)
    sizes = np.array([m.size for m in matrices], dtype=np.int64)
    edge_off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    edge_c = np.concatenate([m.ravel() for m in matrices]).astype(np.float64)
    order = np.arange(nk, dtype=np.int64)
    graph = _Graph(
        node_off, cost, adj_off, adj_edge, adj_nbr, adj_side, slot_off, edge_off, edge_c, edge_slot
    )
    return constant, (graph, order), alive, new_id, costs


# ------------------------------------------------------------------------------------------------- kernels
@njit(cache=True)
def _belief(i, node_off, cost, adj_off, slot_off, msg, out):
    """out[:S_i] = c_i + sum of the messages into i; returns S_i."""
    lo = node_off[i]
    size = node_off[i + 1] - lo
    for x in range(size):
        out[x] = cost[lo + x]
    for s in range(adj_off[i], adj_off[i + 1]):
        base = slot_off[s]
        for x in range(size):
            out[x] += msg[base + x]
    return size


@njit(cache=True)
def _pass(
    forward,
    order,
    pos,
    node_off,
    cost,
    adj_off,
    adj_edge,
    adj_nbr,
    adj_side,
    slot_off,
    edge_off,
    edge_c,
    edge_slot,
    msg,
    scratch,
):
    """One TRW-S pass; returns the bound of the messages it leaves (outgoing = the pass direction)."""
    n = len(order)
    width = (len(scratch) - 2) // 2
    theta = scratch[:width]
    h = scratch[width : 2 * width]
    node_sum = 0.0
    edge_sum = 0.0
    for step in range(n):
        i = order[step] if forward else order[n - 1 - step]
        size = _belief(i, node_off, cost, adj_off, slot_off, msg, theta)
        n_out = 0
        n_in = 0
        for s in range(adj_off[i], adj_off[i + 1]):
            if (pos[adj_nbr[s]] > pos[i]) == forward:
                n_out += 1
            else:
                n_in += 1
        gamma = 1.0 / max(n_in, n_out, 1)
        low = np.inf
        for x in range(size):
            if theta[x] < low:
                low = theta[x]
        node_sum += (1.0 - n_out * gamma) * low
        if n_out == 0:
            continue
        for s in range(adj_off[i], adj_off[i + 1]):
            j = adj_nbr[s]
            if (pos[j] > pos[i]) != forward:
                continue
            e = adj_edge[s]
            mine = slot_off[s]
            target = slot_off[edge_slot[e, 1 - adj_side[s]]]
            tsize = node_off[j + 1] - node_off[j]
            for x in range(size):
                h[x] = gamma * theta[x] - msg[mine + x]
            c0 = edge_off[e]
            if adj_side[s] == 0:  # i indexes the rows
                for y in range(tsize):
                    msg[target + y] = np.inf
                for x in range(size):
                    hx = h[x]
                    row = c0 + x * tsize
                    for y in range(tsize):
                        v = hx + edge_c[row + y]
                        if v < msg[target + y]:
                            msg[target + y] = v
            else:  # i indexes the columns
                for y in range(tsize):
                    row = c0 + y * size
                    best = np.inf
                    for x in range(size):
                        v = edge_c[row + x] + h[x]
                        if v < best:
                            best = v
                    msg[target + y] = best
            delta = np.inf
            for y in range(tsize):
                if msg[target + y] < delta:
                    delta = msg[target + y]
            for y in range(tsize):
                msg[target + y] -= delta
            edge_sum += delta
    return node_sum + edge_sum


@njit(cache=True)
def _evaluate_kernel(
    forward,
    plain,
    pos,
    node_off,
    cost,
    adj_off,
    adj_edge,
    adj_nbr,
    adj_side,
    slot_off,
    edge_off,
    edge_c,
    edge_slot,
    msg,
    theta,
    theta_j,
    h,
):
    """The bound of `msg` recomputed from scratch, and an upper estimate of its rounding error."""
    n = len(node_off) - 1
    total = 0.0
    magnitude = 0.0
    error = 0.0
    for i in range(n):
        size = _belief(i, node_off, cost, adj_off, slot_off, msg, theta)
        deg = adj_off[i + 1] - adj_off[i]
        scale = 0.0
        for x in range(size):
            a = abs(cost[node_off[i] + x])
            for s in range(adj_off[i], adj_off[i + 1]):
                a += abs(msg[slot_off[s] + x])
            if a > scale:
                scale = a
        n_out = 0
        n_in = 0
        for s in range(adj_off[i], adj_off[i + 1]):
            if (pos[adj_nbr[s]] > pos[i]) == forward:
                n_out += 1
            else:
                n_in += 1
        gamma = 0.0 if plain else 1.0 / max(n_in, n_out, 1)
        keep = 1.0 - n_out * gamma
        if keep < 0.0:
            keep = 0.0
        low = np.inf
        for x in range(size):
            if theta[x] < low:
                low = theta[x]
        term = keep * low
        total += term
        magnitude += abs(term)
        error += (deg + 3) * _UNIT * scale
        for s in range(adj_off[i], adj_off[i + 1]):
            j = adj_nbr[s]
            e = adj_edge[s]
            if plain:
                if adj_side[s] != 0:
                    continue
            elif (pos[j] > pos[i]) != forward:
                continue
            # Edge term: min over (x, y) of gamma theta_i(x) + C(x, y) - m_{e->i}(x) - m_{e->j}(y).
            mine = slot_off[s]
            other = slot_off[edge_slot[e, 1 - adj_side[s]]]
            tsize = node_off[j + 1] - node_off[j]
            hmax = 0.0
            for x in range(size):
                h[x] = gamma * theta[x] - msg[mine + x]
                a = gamma * scale + abs(msg[mine + x])
                if a > hmax:
                    hmax = a
            omax = 0.0
            for y in range(tsize):
                theta_j[y] = msg[other + y]
                if abs(theta_j[y]) > omax:
                    omax = abs(theta_j[y])
            c0 = edge_off[e]
            cmax = 0.0
            best = np.inf
            for x in range(size):
                for y in range(tsize):
                    c = edge_c[c0 + x * tsize + y] if adj_side[s] == 0 else edge_c[c0 + y * size + x]
                    if abs(c) > cmax:
                        cmax = abs(c)
                    v = (h[x] + c) - theta_j[y]
                    if v < best:
                        best = v
            total += best
            magnitude += abs(best)
            error += 4.0 * _UNIT * (hmax + cmax + omax)
    error += 2.0 * _UNIT * (2 * n + len(adj_edge)) * magnitude
    return total, error


def _evaluate(
    graph: _Graph, forward: bool, plain: bool, pos: np.ndarray, msg: np.ndarray
) -> tuple[float, float]:
    width = int(np.max(np.diff(graph.node_off)))
    theta, theta_j, h = np.zeros(width), np.zeros(width), np.zeros(width)
    total, error = _evaluate_kernel(forward, plain, pos, *graph, msg, theta, theta_j, h)
    return float(total), float(error)
