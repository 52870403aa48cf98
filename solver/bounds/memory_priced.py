"""A proven lower bound with the memory limit dualised: Lagrangian relaxation over TRW-S (`trws.dual_bound`).

The memory rows are the maximal time steps ``r`` (`solver.ilp.memory_row_times`); a term ``t`` of node
``k`` covers the rows ``[first_t, stop_t)``. With each term's minimum usage ``min_t`` moved into a
per-row base, the rows read ``sum_{t covers r} u'_t(s_k) <= L_r = L - base_r`` (``u' = u - min_t``). For
any ``mu >= 0`` on the rows,

    min_{x memory-feasible} f(x) >= min_x [f(x) + sum_t u'_t(x_k) price_t] - sum_r mu_r L_r,

``price_t = sum_{r in [first_t, stop_t)} mu_r``: the bracket is a problem of the same form with node
costs raised by ``u'_t * price_t``, bounded below by TRW-S. ``mu`` follows projected subgradient steps
(Polyak steps towards the upper bound, or towards a target above the best bound without one; the step
factor halves when the bound stalls) with ``g_r`` the usage of an assignment decoded from the messages
minus ``L_r``. The messages carry over from step to step (the bound holds for any messages).

The returned value is recomputed from scratch for one fixed ``mu`` and its messages (those of the best
estimate seen, ``mu = 0`` included: `dual_bound`'s passes), minus `dual_bound`'s rounding margin and a
margin for the rounding of the priced costs.

The ascent also says which strategies memory prices make worth a look (`memory_priced_ascent`): every
strategy a decoding took at any ``mu`` tried, and each node's best beliefs (cost plus messages in) at the
best ``mu``. On IOPDDL V (392 super nodes, 11,280 strategies) the decodings of one ascent (1.5 s, ~500 of
them) take 879 strategies, among them the contest winner's at 383 of the 392 nodes; the program over those,
the best beliefs and the strategies of the search in `solver.bounds.lagrangian_branch` (1,878 strategies,
18,399 columns) is optimal at 1,760,426 in 16 s, where the latter's alone (at ``mu = 0`` there: its cutting
planes do not lift the bound) gives 2,113,295.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from solver.bounds.trws import _UNIT, STALL_PASSES, _certify, _pass, _prepare_mapped, beliefs, dual_bound
from solver.compact import CompactProblem
from solver.ilp import concatenated_ranges, memory_row_times

#: TRW-S passes per subgradient step (even: the last is backward, then decoding runs forward).
INNER_PASSES = 2
#: Initial factor of the Polyak steps.
START_FACTOR = 1.0
#: Steps without a better bound after which the step factor is halved.
PATIENCE = 10
#: The ascent stops once the step factor is below this.
MIN_FACTOR = 1e-4
#: At most this share of the time goes to the memory-free warm-up (mu = 0 until the passes stall).
WARMUP_SHARE = 0.2
#: Without an upper bound, the Polyak target is the best bound plus this share of its magnitude.
TARGET_GAP = 0.1
#: A strategy whose belief at a search's best prices is within this share of the bound of its node's best is
#: promising (the minima, up to rounding; here and in `solver.bounds.lagrangian_branch`).
BELIEF_TOLERANCE = 1e-7


@dataclass
class PricedAscent:
    """What `memory_priced_ascent` found: the proven bound; per node, the strategies (the problem's indices,
    sorted) the prices make promising; the cheapest decoded assignment within the limit and its cost (None,
    inf without one)."""

    bound: float
    promising: list[np.ndarray] | None
    answer: np.ndarray | None
    cost: float


def memory_dual_bound(problem: CompactProblem, time_limit: float, upper_bound: float | None = None) -> float:
    """Proven lower bound with the memory limit dualised (Lagrangian); dual_bound without a limit.

    `upper_bound` (any value at least the optimum, e.g. an incumbent's cost) sizes the subgradient steps;
    without one, a target above the best bound is used and the steps shrink. The value at ``mu = 0`` (the
    memory-free TRW-S bound of `dual_bound`) is a candidate too. ``inf`` when proven infeasible. Stops at
    `time_limit` seconds (kernel compile time included), or earlier once the steps have shrunk away.
    """
    if problem.usage_limit is None or len(problem.term_node) == 0:
        return dual_bound(problem, time_limit)
    return memory_priced_ascent(problem, time_limit, upper_bound).bound


def memory_priced_ascent(
    problem: CompactProblem, time_limit: float, upper_bound: float | None = None
) -> PricedAscent:
    """`memory_dual_bound`'s ascent, with the strategies it makes promising and its best decoded answer
    (none of them where no memory row is priced: no limit, or nothing that could overflow it)."""
    started = time.perf_counter()
    deadline = started + max(0.0, time_limit)
    prepared = _prepare_mapped(problem) if problem.usage_limit is not None else None
    if prepared is None:
        bound = math.inf if problem.usage_limit is not None else dual_bound(problem, time_limit)
        return PricedAscent(bound, None, None, math.inf)
    _, arrays, alive, new_id, costs = prepared
    lagrangian = _Lagrangian(problem, arrays, alive, new_id, costs)
    if lagrangian.infeasible:  # the minimum usages alone exceed the limit at some step
        return PricedAscent(math.inf, None, None, math.inf)
    if lagrangian.num_rows == 0 or len(lagrangian.term_first) == 0:
        return PricedAscent(
            dual_bound(problem, max(0.0, deadline - time.perf_counter())), None, None, math.inf
        )
    return lagrangian.ascend(started, deadline, upper_bound)


class _Lagrangian:
    """Flat arrays built once. Flat positions: the TRW-S graph's strategies (``graph.cost``), then those of
    the nodes without edges; entries: the (priced term, alive strategy) pairs with ``u'``."""

    def __init__(self, problem: CompactProblem, arrays, alive, new_id, costs) -> None:
        self.problem = problem
        self.alive = alive
        self.new_id = new_id
        self.graph, self.order = arrays if arrays is not None else (None, None)
        n = problem.num_nodes
        counts = np.array([len(c) for c in costs], dtype=np.int64)
        self.node_sizes = counts
        self.kept_flat = 0 if self.graph is None else len(self.graph.cost)
        self.isolated = np.flatnonzero(new_id < 0)
        self.kept = np.flatnonzero(new_id >= 0)
        self.iso_off = np.concatenate([[0], np.cumsum(counts[self.isolated])]).astype(np.int64)
        self.iso_base = (
            np.concatenate([costs[k] for k in self.isolated.tolist()]) if len(self.isolated) else np.zeros(0)
        )
        self.kept_base = np.zeros(0) if self.graph is None else self.graph.cost.copy()
        self.total_flat = self.kept_flat + len(self.iso_base)
        node_start = np.empty(n, dtype=np.int64)
        if self.graph is not None:
            node_start[self.kept] = self.graph.node_off[new_id[self.kept]]
        node_start[self.isolated] = self.kept_flat + self.iso_off[:-1]
        self.node_start = node_start
        # The problem's strategy index of each flat position.
        self.original_index = np.empty(self.total_flat, dtype=np.int64)
        for k in range(n):
            self.original_index[node_start[k] : node_start[k] + counts[k]] = np.flatnonzero(alive[k])
        # Start of every node's block in flat order (for per-node maxima in the margin).
        self.block_starts = np.sort(node_start)
        # Strategies a branch forbids (flat positions, `solver.bounds.lagrangian_branch`): `set_costs` prices
        # them above every total of allowed strategies. The problem with them merely dear is a relaxation of
        # the one without them, so every bound still holds.
        self.forbidden: np.ndarray | None = None
        edges = np.zeros(0) if self.graph is None else self.graph.edge_c
        edge_starts = np.zeros(0, np.int64) if self.graph is None else self.graph.edge_off[:-1]
        self.edge_spread = (
            float((np.maximum.reduceat(edges, edge_starts) - np.minimum.reduceat(edges, edge_starts)).sum())
            if len(edges)
            else 0.0
        )

        usages = [
            np.asarray(u, dtype=np.int64)[alive[k]]
            for u, k in zip(problem.term_usages, problem.term_node.tolist(), strict=True)
        ]
        intervals = problem.term_intervals
        times = memory_row_times(intervals[:, 0], intervals[:, 1])
        self.row_times = times  # the time step of each row (``mu``'s index)
        self.num_rows = len(times)
        first = np.searchsorted(times, intervals[:, 0], side="left")
        stop = np.searchsorted(times, intervals[:, 1], side="left")
        covers = first < stop
        usage_min = np.array([int(u.min()) for u in usages], dtype=np.int64)
        usage_max = np.array([int(u.max()) for u in usages], dtype=np.int64)
        base = np.zeros(self.num_rows + 1, dtype=np.int64)
        np.add.at(base, first[covers], usage_min[covers])
        np.add.at(base, stop[covers], -usage_min[covers])
        row_limit = int(problem.usage_limit) - np.cumsum(base)[: self.num_rows]
        self.infeasible = bool((row_limit < 0).any())
        self.row_limit = row_limit.astype(np.float64)

        priced = np.flatnonzero(covers & (usage_max > usage_min))
        self.term_first = first[priced]
        self.term_stop = stop[priced]
        self.term_node = problem.term_node[priced]
        sizes = np.array([len(usages[t]) for t in priced.tolist()], dtype=np.int64)
        self.term_entry_off = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.entry_term = np.repeat(np.arange(len(priced), dtype=np.int64), sizes)
        self.entry_pos = np.repeat(node_start[self.term_node], sizes) + concatenated_ranges(sizes)
        extra = [usages[t] - usage_min[t] for t in priced.tolist()]
        self.entry_use = (np.concatenate(extra) if extra else np.zeros(0, np.int64)).astype(np.float64)
        # Rounding margin of the priced costs, per unit of sum(mu): sum of u' over a position's terms times
        # the error count of prefix sums (rows), products and the per-position sums (terms).
        flat_use = np.bincount(self.entry_pos, weights=self.entry_use, minlength=self.total_flat)
        terms_per_node = np.bincount(self.term_node, minlength=n)
        count = 1.1 * (2 * self.num_rows + int(terms_per_node.max(initial=0)) + 8)
        self.flat_error = flat_use * (count * _UNIT)

    # ------------------------------------------------------------------------------------------ pricing
    def set_costs(self, mu: np.ndarray) -> np.ndarray:
        """Raise the graph's costs by the prices of `mu` (in place); returns the isolated nodes' costs."""
        prefix = np.concatenate([[0.0], np.cumsum(mu)])
        price = prefix[self.term_stop] - prefix[self.term_first]
        added = np.bincount(
            self.entry_pos, weights=self.entry_use * price[self.entry_term], minlength=self.total_flat
        )
        if self.forbidden is not None and self.forbidden.any():
            flat = np.concatenate([self.kept_base, self.iso_base]) + added
            spread = np.maximum.reduceat(flat, self.block_starts) - np.minimum.reduceat(
                flat, self.block_starts
            )
            flat[self.forbidden] = float(flat.max()) + float(spread.sum()) + self.edge_spread + 1.0
            if self.graph is not None:
                self.graph.cost[:] = flat[: self.kept_flat]
            return flat[self.kept_flat :]
        if self.graph is not None:
            np.add(self.kept_base, added[: self.kept_flat], out=self.graph.cost)
        return self.iso_base + added[self.kept_flat :]

    def iso_min(self, iso_cost: np.ndarray) -> np.ndarray:
        if len(iso_cost) == 0:
            return np.zeros(0)
        return np.minimum.reduceat(iso_cost, self.iso_off[:-1])

    def certify(self, mu: np.ndarray, forward: bool, pos: np.ndarray, msg: np.ndarray) -> float:
        """The proven bound of fixed `mu` and `msg`, recomputed from scratch."""
        iso_cost = self.set_costs(mu)
        iso_min = self.iso_min(iso_cost)
        lag_terms = mu * self.row_limit
        constant = math.fsum(iso_min.tolist()) - math.fsum(lag_terms.tolist())
        extra = float(np.abs(iso_min).sum() + np.abs(lag_terms).sum())
        # Priced costs versus exact ones: per node, the largest error over its strategies.
        mass = math.fsum(mu.tolist()) * (1.0 + 1e-9)
        flat = iso_cost if self.graph is None else np.concatenate([self.graph.cost, iso_cost])
        error = self.flat_error * mass + (1.01 * _UNIT) * np.abs(flat)
        price_margin = 1.01 * float(np.maximum.reduceat(error, self.block_starts).sum())
        if self.graph is None:
            value = constant - 8.0 * _UNIT * (abs(constant) + extra) - 1e-12 * abs(constant)
        else:
            value = _certify(self.graph, forward, pos, msg, constant, extra)
        return float(value - price_margin)

    # ------------------------------------------------------------------------------------------- decoding
    def decode(self, msg: np.ndarray, pos: np.ndarray, iso_cost: np.ndarray, scratch: np.ndarray):
        """Per node, the chosen alive strategy (local index), TRW-S style: forward, conditioned on the
        nodes already chosen, messages for the others; nodes without edges at their cheapest."""
        local = np.empty(self.problem.num_nodes, dtype=np.int64)
        if self.graph is not None:
            x = np.empty(len(self.order), dtype=np.int64)
            _decode(self.order, *self.graph, msg, x, scratch)
            local[self.kept] = x[self.new_id[self.kept]]
        if len(self.isolated):
            local[self.isolated] = _segment_argmin(iso_cost, self.iso_off)
        return local

    def row_usage(self, local: np.ndarray) -> np.ndarray:
        """Usage above the base at each row."""
        used = self.entry_use[self.term_entry_off + local[self.term_node]]
        size = self.num_rows + 1
        diff = np.bincount(self.term_first, weights=used, minlength=size)
        diff -= np.bincount(self.term_stop, weights=used, minlength=size)
        return np.cumsum(diff)[: self.num_rows]

    def original_cost(self, local: np.ndarray) -> float:
        """Objective of the decoded assignment in the problem (``inf`` when forbidden)."""
        return self.problem.cost(self.original_index[self.node_start + local])

    # ------------------------------------------------------------------------------------------- ascent
    def ascend(self, started: float, deadline: float, upper_bound: float | None) -> PricedAscent:
        graph = self.graph
        mu = np.zeros(self.num_rows)
        if graph is not None:
            n = len(graph.node_off) - 1
            pos = np.empty(n, dtype=np.int64)
            pos[self.order] = np.arange(n, dtype=np.int64)
            msg = np.zeros(int(graph.slot_off[-1]), dtype=np.float64)
            scratch = np.zeros(int(np.max(np.diff(graph.node_off))) * 2 + 2, dtype=np.float64)
        else:
            pos = msg = scratch = np.zeros(0)
        best = -math.inf
        best_mu, best_msg, best_forward = mu.copy(), msg.copy(), True
        upper = math.inf if upper_bound is None else float(upper_bound)
        decoded = np.zeros(self.total_flat, dtype=bool)
        answer: np.ndarray | None = None
        answer_cost = math.inf

        def snapshot(estimate: float, forward: bool) -> bool:
            nonlocal best, best_mu, best_msg, best_forward
            if estimate <= best:
                return False
            gain = estimate - best
            best = estimate
            best_mu[:] = mu
            best_msg[:] = msg
            best_forward = forward
            return gain > 1e-9 * (abs(estimate) + 1.0)

        # Warm-up at mu = 0: `dual_bound`'s passes until they stall (or a share of the time).
        iso_cost = self.set_costs(mu)
        iso_sum = float(self.iso_min(iso_cost).sum())
        warm_until = started + WARMUP_SHARE * (deadline - started)
        forward = True
        reserve = 0.0
        value = 0.0
        if graph is not None:
            stall = 0
            while True:
                tick = time.perf_counter()
                value = _pass(forward, self.order, pos, *graph, msg, scratch)
                reserve = max(reserve, 3.0 * (time.perf_counter() - tick))
                stall = 0 if snapshot(value + iso_sum, forward) else stall + 1
                forward = not forward
                now = time.perf_counter()
                if stall >= STALL_PASSES or now >= warm_until or now + reserve >= deadline:
                    break
            if not forward:  # end on a backward pass, for the forward decoding
                value = _pass(forward, self.order, pos, *graph, msg, scratch)
                forward = True
        else:
            snapshot(iso_sum, True)

        factor = START_FACTOR
        since_best = 0
        while time.perf_counter() + reserve < deadline:
            local = self.decode(msg, pos, iso_cost, scratch)
            decoded[self.node_start + local] = True
            g = self.row_usage(local) - self.row_limit
            if (g <= 0).all():
                cost = self.original_cost(local)
                upper = min(upper, cost)
                if cost < answer_cost:
                    answer, answer_cost = self.original_index[self.node_start + local], cost
            g[(mu <= 0) & (g < 0)] = 0.0
            norm = float(g @ g)
            if best >= upper - 1e-12 * abs(upper) or factor < MIN_FACTOR:
                break
            if norm > 0:
                target = upper if math.isfinite(upper) else best + TARGET_GAP * (abs(best) + 1.0)
                current = value + iso_sum - float(mu @ self.row_limit)
                step = factor * max(target - current, 0.0) / norm
                np.maximum(mu + step * g, 0.0, out=mu)
            iso_cost = self.set_costs(mu)
            iso_sum = float(self.iso_min(iso_cost).sum())
            value = 0.0
            if graph is not None:
                for _ in range(INNER_PASSES):
                    value = _pass(forward, self.order, pos, *graph, msg, scratch)
                    forward = not forward
            if snapshot(value + iso_sum - float(mu @ self.row_limit), not forward):
                since_best = 0
            else:
                since_best += 1
                if since_best >= PATIENCE:
                    factor *= 0.5
                    since_best = 0

        bound = self.certify(best_mu, best_forward, pos, best_msg)
        promising = self.per_node(decoded | self.best_beliefs(best_mu, best_msg, bound))
        return PricedAscent(bound, promising, answer, answer_cost)

    def best_beliefs(self, mu: np.ndarray, msg: np.ndarray, bound: float) -> np.ndarray:
        """Per flat position: whether its belief at prices ``mu`` with messages ``msg`` (a node without
        edges: its priced cost) is within `BELIEF_TOLERANCE` (a share of ``|bound|``) of its node's best.
        Where the relaxation is tight, an optimum of the priced problem takes only those."""
        tolerance = BELIEF_TOLERANCE * max(1.0, abs(bound))
        iso_cost = self.set_costs(mu)
        best = np.zeros(self.total_flat, dtype=bool)
        if self.graph is not None:
            for i, belief in enumerate(beliefs(self.graph, msg)):
                start = int(self.graph.node_off[i])
                best[start + np.flatnonzero(belief <= belief.min() + tolerance)] = True
        for j in range(len(self.isolated)):
            block = iso_cost[self.iso_off[j] : self.iso_off[j + 1]]
            best[self.kept_flat + self.iso_off[j] + np.flatnonzero(block <= block.min() + tolerance)] = True
        return best

    def per_node(self, marked: np.ndarray) -> list[np.ndarray]:
        """Per node of the problem, its strategies (the problem's indices, sorted) whose flat positions are
        ``marked``."""
        return [
            np.sort(self.original_index[start : start + size][marked[start : start + size]])
            for start, size in zip(self.node_start.tolist(), self.node_sizes.tolist(), strict=True)
        ]


# ------------------------------------------------------------------------------------------------- kernels
@njit(cache=True)
def _decode(
    order,
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
    x,
    scratch,
):
    """x[i] for the graph's nodes in `order`: cost + edges to chosen neighbours + messages from the rest."""
    n = len(order)
    for i in range(n):
        x[i] = -1
    for step in range(n):
        i = order[step]
        lo = node_off[i]
        size = node_off[i + 1] - lo
        for a in range(size):
            scratch[a] = cost[lo + a]
        for s in range(adj_off[i], adj_off[i + 1]):
            j = adj_nbr[s]
            if x[j] >= 0:
                c0 = edge_off[adj_edge[s]]
                tsize = node_off[j + 1] - node_off[j]
                if adj_side[s] == 0:  # i indexes the rows
                    for a in range(size):
                        scratch[a] += edge_c[c0 + a * tsize + x[j]]
                else:
                    for a in range(size):
                        scratch[a] += edge_c[c0 + x[j] * size + a]
            else:
                base = slot_off[s]
                for a in range(size):
                    scratch[a] += msg[base + a]
        chosen = 0
        for a in range(1, size):
            if scratch[a] < scratch[chosen]:
                chosen = a
        x[i] = chosen


@njit(cache=True)
def _segment_argmin(values, off):
    """Per segment ``values[off[j]:off[j + 1]]``, the index of its minimum within the segment."""
    out = np.empty(len(off) - 1, dtype=np.int64)
    for j in range(len(off) - 1):
        chosen = 0
        for a in range(1, off[j + 1] - off[j]):
            if values[off[j] + a] < values[off[j] + chosen]:
                chosen = a
        out[j] = chosen
    return out
