"""Numba kernels of the anytime heuristic: usage segment tree, tree-DP moves, the search loop.

Everything here works on flat arrays (see `solver.heuristics.state`) so that numba compiles it once
(``cache=True``). The state of a search is an assignment, a lazy segment tree holding the usage at every
compressed time point, and the exact objective split into ``nviol`` (forbidden choices made) and ``finite``
(the sum of the finite costs chosen).

The one move is *exact dynamic programming on an induced tree*: grow a random tree ``T`` of nodes around a
root such that the only graph edges among ``T`` are tree edges, fix every other node, and choose the
min-sum assignment of ``T`` (unary: node cost + price + edges to fixed nodes; binary: tree edges). A tree
of one node is a best single-node move; a star is a node moved together with its neighbours. Memory is
handled by allowing a strategy only when its usage increase fits the slack of its interval (then checking
the whole profile, and retrying with "no increase anywhere" if two changes collide). A *forced* move
forbids the root's current strategy, which gives the non-improving steps that late acceptance needs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Value of a strategy the DP may not pick (memory or forced change).
DIS = 1e30
#: Value of the padding leaves of the segment tree.
NEG = -(1 << 60)


# ----------------------------------------------------------------------------- segment tree
@njit(cache=True)
def seg_build(leaves: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A max segment tree with range add over ``leaves`` (power-of-two ``size``); ``t[1]`` is the max."""
    t = np.full(2 * size, NEG, dtype=np.int64)
    d = np.zeros(2 * size, dtype=np.int64)
    t[size : size + len(leaves)] = leaves
    for p in range(size - 1, 0, -1):
        t[p] = max(t[2 * p], t[2 * p + 1])
    return t, d


@njit(cache=True)
def _seg_up(t: np.ndarray, d: np.ndarray, p: int) -> None:
    while p > 1:
        p >>= 1
        t[p] = max(t[2 * p], t[2 * p + 1]) + d[p]


@njit(cache=True)
def seg_add(t: np.ndarray, d: np.ndarray, size: int, lo: int, hi: int, value: int) -> None:
    """Add ``value`` to every point in ``[lo, hi)``."""
    left, right = lo + size, hi + size
    while left < right:
        if left & 1:
            t[left] += value
            if left < size:
                d[left] += value
            left += 1
        if right & 1:
            right -= 1
            t[right] += value
            if right < size:
                d[right] += value
        left >>= 1
        right >>= 1
    _seg_up(t, d, lo + size)
    _seg_up(t, d, hi - 1 + size)


@njit(cache=True)
def seg_max(t: np.ndarray, d: np.ndarray, size: int, lo: int, hi: int) -> int:
    """Max over ``[lo, hi)``: the canonical nodes plus the pending adds of their ancestors."""
    best = NEG
    left, right = lo + size, hi + size
    while left < right:
        if left & 1:
            best = max(best, _with_ancestors(t, d, left))
            left += 1
        if right & 1:
            right -= 1
            best = max(best, _with_ancestors(t, d, right))
        left >>= 1
        right >>= 1
    return best


@njit(cache=True)
def _with_ancestors(t: np.ndarray, d: np.ndarray, p: int) -> int:
    value = t[p]
    p >>= 1
    while p >= 1:
        value += d[p]
        p >>= 1
    return value


# ----------------------------------------------------------------------------- costs
@njit(cache=True)
def edge_value(f, e: int, sa: int, sb: int) -> float:
    """Cost of edge ``e`` when its first node takes ``sa`` and its second ``sb``."""
    return f.ecost[f.eoff[e] + sa * f.ncount[f.eb[e]] + sb]


@njit(cache=True)
def local_cost(f, assign: np.ndarray, nodes: np.ndarray, count: int, cmark: np.ndarray, stamp: int):
    """(forbidden count, finite cost, price) of ``nodes[:count]`` and every edge touching them, once each."""
    for i in range(count):
        cmark[nodes[i]] = stamp
    nviol = 0
    finite = 0.0
    price = 0.0
    for i in range(count):
        v = nodes[i]
        k = f.noff[v] + assign[v]
        if f.ncost[k] >= f.forb:
            nviol += 1
        else:
            finite += f.ncost[k]
        price += f.nprice[k]
        for a in range(f.adj_off[v], f.adj_off[v + 1]):
            w = f.adj_other[a]
            if cmark[w] == stamp and w < v:
                continue
            e = f.adj_edge[a]
            value = edge_value(f, e, assign[f.ea[e]], assign[f.eb[e]])
            if value >= f.forb:
                nviol += 1
            else:
                finite += value
    return nviol, finite, price


@njit(cache=True)
def set_strategy(f, s, v: int, new: int) -> None:
    """Give node ``v`` strategy ``new``, updating the usage tree."""
    old = s.assign[v]
    for q in range(f.nterm_off[v], f.nterm_off[v + 1]):
        delta = f.tuse[f.tuoff[q] + new] - f.tuse[f.tuoff[q] + old]
        if delta != 0:
            seg_add(s.seg_t, s.seg_d, s.seg_size, f.tlo[q], f.thi[q], delta)
    s.assign[v] = new


# ----------------------------------------------------------------------------- tree DP move
@njit(cache=True)
def grow_tree(f, s, w, root: int, max_nodes: int, max_work: int, induced: bool) -> int:
    """Grow a random tree from ``root`` into ``w.tree``/``w.parent``/``w.pedge``; its size.

    An *induced* tree has no graph edge between its nodes other than its own edges, so that the DP is
    exact; otherwise other edges inside it are priced as if their far end kept its strategy.
    """
    w.stamp[0] += 1
    stamp = w.stamp[0]
    w.tree[0] = root
    w.parent[0] = -1
    w.pedge[0] = -1
    w.tmark[root] = stamp
    w.upos[0] = 0
    used = f.ncount[root]
    work = (f.adj_off[root + 1] - f.adj_off[root]) * f.ncount[root]
    ntree = 1
    ncand = _push_candidates(f, w, root, 0, 0)
    while ntree < max_nodes and ncand > 0:
        j = np.random.randint(ncand)
        x, pidx, e = w.cand[j], w.cand_parent[j], w.cand_edge[j]
        ncand -= 1
        w.cand[j], w.cand_parent[j], w.cand_edge[j] = w.cand[ncand], w.cand_parent[ncand], w.cand_edge[ncand]
        if w.tmark[x] == stamp or w.rmark[x] == stamp:
            continue
        if induced:
            inside = 0
            for a in range(f.adj_off[x], f.adj_off[x + 1]):
                if w.tmark[f.adj_other[a]] == stamp:
                    inside += 1
            if inside != 1:
                w.rmark[x] = stamp
                continue
        sx = f.ncount[x]
        cost = sx * f.ncount[w.tree[pidx]] + (f.adj_off[x + 1] - f.adj_off[x]) * sx
        if used + sx > len(w.ubuf) or work + cost > max_work:
            continue
        w.tree[ntree] = x
        w.parent[ntree] = pidx
        w.pedge[ntree] = e
        w.upos[ntree] = used
        w.tmark[x] = stamp
        w.emark[e] = stamp
        used += sx
        work += cost
        ncand = _push_candidates(f, w, x, ntree, ncand)
        ntree += 1
    w.upos[ntree] = used
    return ntree


@njit(cache=True)
def _push_candidates(f, w, x: int, xidx: int, ncand: int) -> int:
    stamp = w.stamp[0]
    for a in range(f.adj_off[x], f.adj_off[x + 1]):
        y = f.adj_other[a]
        if w.tmark[y] == stamp or w.rmark[y] == stamp or ncand >= len(w.cand):
            continue
        w.cand[ncand] = y
        w.cand_parent[ncand] = xidx
        w.cand_edge[ncand] = f.adj_edge[a]
        ncand += 1
    return ncand


@njit(cache=True)
def tree_unaries(f, s, w, ntree: int, strict: bool, force: bool) -> None:
    """Fill ``w.ubuf`` with each tree node's unary cost; DIS where memory (or forcing) forbids it."""
    stamp = w.stamp[0]
    for i in range(ntree):
        v = w.tree[i]
        base = w.upos[i]
        sv = f.ncount[v]
        cur = s.assign[v]
        for x in range(sv):
            w.ubuf[base + x] = f.ncost[f.noff[v] + x] + f.nprice[f.noff[v] + x]
        for a in range(f.adj_off[v], f.adj_off[v + 1]):
            e = f.adj_edge[a]
            if w.emark[e] == stamp:
                continue
            y = f.adj_other[a]
            if f.ea[e] == v:
                row = f.eoff[e] + s.assign[y]
                step = f.ncount[y]
                for x in range(sv):
                    w.ubuf[base + x] += f.ecost[row + x * step]
            else:
                row = f.eoff[e] + s.assign[y] * sv
                for x in range(sv):
                    w.ubuf[base + x] += f.ecost[row + x]
        for q in range(f.nterm_off[v], f.nterm_off[v + 1]):
            slack = 0
            if not strict:
                slack = max(0, f.limit - seg_max(s.seg_t, s.seg_d, s.seg_size, f.tlo[q], f.thi[q]))
            now = f.tuse[f.tuoff[q] + cur]
            for x in range(sv):
                if f.tuse[f.tuoff[q] + x] - now > slack:
                    w.ubuf[base + x] = DIS
        if force and i == 0:
            w.ubuf[base + cur] = DIS


@njit(cache=True)
def tree_solve(f, w, ntree: int) -> float:
    """Min-sum DP over the tree (leaves up); writes the optimum into ``w.choice``; returns its value."""
    for i in range(ntree - 1, 0, -1):
        v = w.tree[i]
        p = w.tree[w.parent[i]]
        e = w.pedge[i]
        sv, sp = f.ncount[v], f.ncount[p]
        vbase, pbase = w.upos[i], w.upos[w.parent[i]]
        abase = w.apos[i]
        v_first = f.ea[e] == v
        for y in range(sp):
            best = DIS * 4.0
            arg = 0
            for x in range(sv):
                if v_first:
                    value = w.ubuf[vbase + x] + f.ecost[f.eoff[e] + x * sp + y]
                else:
                    value = w.ubuf[vbase + x] + f.ecost[f.eoff[e] + y * sv + x]
                if value < best:
                    best = value
                    arg = x
            w.ubuf[pbase + y] += best
            w.abuf[abase + y] = arg
    root_best = DIS * 4.0
    for x in range(f.ncount[w.tree[0]]):
        if w.ubuf[w.upos[0] + x] < root_best:
            root_best = w.ubuf[w.upos[0] + x]
            w.choice[0] = x
    for i in range(1, ntree):
        w.choice[i] = w.abuf[w.apos[i] + w.choice[w.parent[i]]]
    return root_best


@njit(cache=True)
def arg_positions(f, w, ntree: int) -> bool:
    """Offsets of each child's argmin table (one entry per parent strategy); False when it overflows."""
    pos = 0
    for i in range(1, ntree):
        w.apos[i] = pos
        pos += f.ncount[w.tree[w.parent[i]]]
    return pos <= len(w.abuf)


@njit(cache=True)
def apply_tree(f, s, w, ntree: int, threshold: float) -> int:
    """Apply ``w.choice`` if memory fits and the objective rises by at most ``threshold``.

    Returns 1 when applied, 0 when rejected on cost or nothing changed, -1 when rejected on memory.
    """
    nchanged = 0
    for i in range(ntree):
        if w.choice[i] != s.assign[w.tree[i]]:
            w.changed[nchanged] = w.tree[i]
            w.newval[nchanged] = w.choice[i]
            w.oldval[nchanged] = s.assign[w.tree[i]]
            nchanged += 1
    if nchanged == 0:
        return 0
    w.stamp[0] += 1
    v0, f0, p0 = local_cost(f, s.assign, w.changed, nchanged, w.cmark, w.stamp[0])
    peak0 = s.seg_t[1]
    for i in range(nchanged):
        set_strategy(f, s, w.changed[i], w.newval[i])
    w.stamp[0] += 1
    v1, f1, p1 = local_cost(f, s.assign, w.changed, nchanged, w.cmark, w.stamp[0])
    peak1 = s.seg_t[1]
    delta = (v1 - v0) * f.forb + (f1 - f0) + (p1 - p0)
    memory_ok = peak1 <= f.limit or peak1 <= peak0
    if memory_ok and (v1 < v0 or (v1 == v0 and delta <= threshold)):
        s.nviol[0] += v1 - v0
        s.finite[0] += f1 - f0
        s.price[0] += p1 - p0
        return 1
    for i in range(nchanged):
        set_strategy(f, s, w.changed[i], w.oldval[i])
    return 0 if memory_ok else -1


@njit(cache=True)
def tree_move(
    f, s, w, root: int, max_nodes: int, max_work: int, induced: bool, force: bool, threshold: float
) -> int:
    """One DP move around ``root``; 1 when the assignment changed."""
    ntree = grow_tree(f, s, w, root, max_nodes, max_work, induced)
    if not arg_positions(f, w, ntree):
        ntree = 1
    for strict in (False, True):
        tree_unaries(f, s, w, ntree, strict, force)
        if tree_solve(f, w, ntree) >= DIS:
            return 0
        result = apply_tree(f, s, w, ntree, threshold)
        if result >= 0:
            return result
    return 0


# ----------------------------------------------------------------------------- search loop
@njit(cache=True)
def search_chunk(f, s, w, params: np.ndarray, focus: np.ndarray, history: np.ndarray, moves: int) -> int:
    """``moves`` late-acceptance DP moves; keeps ``s.best`` (the best violation-free state seen).

    ``params``: [max_nodes, max_work, forced share, focus share, non-induced share]. ``history`` is the
    late acceptance list of objective values, ``s.step[0]`` the move counter. Returns the moves applied.
    """
    max_nodes = int(params[0])
    max_work = int(params[1])
    n = len(s.assign)
    applied = 0
    for _ in range(moves):
        if len(focus) > 0 and np.random.random() < params[3]:
            root = focus[np.random.randint(len(focus))]
        else:
            root = np.random.randint(n)
        force = np.random.random() < params[2]
        current = s.nviol[0] * f.forb + s.finite[0] + s.price[0]
        slot = s.step[0] % len(history)
        threshold = max(0.0, history[slot] - current) if force else 0.0
        was_best = s.nviol[0] == 0 and s.finite[0] < s.best_cost[0]
        if was_best and force:
            s.best[:] = s.assign
            s.best_cost[0] = s.finite[0]
        size = 1 + np.random.randint(max_nodes)
        induced = np.random.random() >= params[4]
        if tree_move(f, s, w, root, size, max_work, induced, force, threshold) == 1:
            applied += 1
        current = s.nviol[0] * f.forb + s.finite[0] + s.price[0]
        if current < history[slot]:
            history[slot] = current
        s.step[0] += 1
    if s.nviol[0] == 0 and s.finite[0] < s.best_cost[0]:
        s.best[:] = s.assign
        s.best_cost[0] = s.finite[0]
    return applied


@njit(cache=True)
def seed_rng(seed: int) -> None:
    """Seed numba's generator (the kernels' only source of randomness)."""
    np.random.seed(seed)


# ----------------------------------------------------------------------------- global construction
@njit(cache=True)
def min_sum_bp(f, rev: np.ndarray, moff: np.ndarray, iters: int, damping: float) -> np.ndarray:
    """Loopy min-sum belief propagation (sweeps forward and back); the argmin of the final beliefs.

    ``msg[moff[k]:]`` is the message into node ``v`` along its adjacency entry ``k``; ``rev[k]`` is the
    entry of the same edge at the other end. Costs include the memory prices ``nprice``.
    """
    n = len(f.ncount)
    msg = np.zeros(moff[-1])
    belief = np.zeros(f.ncount.max())
    h = np.zeros(f.ncount.max())
    new = np.zeros(f.ncount.max())
    cap = f.forb
    for it in range(iters):
        for step in range(n):
            v = step if it % 2 == 0 else n - 1 - step
            sv = f.ncount[v]
            for x in range(sv):
                belief[x] = min(f.ncost[f.noff[v] + x], cap) + f.nprice[f.noff[v] + x]
            for k in range(f.adj_off[v], f.adj_off[v + 1]):
                for x in range(sv):
                    belief[x] += msg[moff[k] + x]
            for k in range(f.adj_off[v], f.adj_off[v + 1]):
                y = f.adj_other[k]
                e = f.adj_edge[k]
                sy = f.ncount[y]
                for x in range(sv):
                    h[x] = belief[x] - msg[moff[k] + x]
                low = np.inf
                for t in range(sy):
                    best = np.inf
                    for x in range(sv):
                        if f.ea[e] == v:
                            value = h[x] + min(f.ecost[f.eoff[e] + x * sy + t], cap)
                        else:
                            value = h[x] + min(f.ecost[f.eoff[e] + t * sv + x], cap)
                        best = min(best, value)
                    new[t] = best
                    low = min(low, best)
                r = rev[k]
                for t in range(sy):
                    msg[moff[r] + t] = damping * msg[moff[r] + t] + (1.0 - damping) * (new[t] - low)
    assign = np.zeros(n, dtype=np.int64)
    for v in range(n):
        sv = f.ncount[v]
        best = np.inf
        for x in range(sv):
            value = min(f.ncost[f.noff[v] + x], cap) + f.nprice[f.noff[v] + x]
            for k in range(f.adj_off[v], f.adj_off[v + 1]):
                value += msg[moff[k] + x]
            if value < best:
                best = value
                assign[v] = x
    return assign


@njit(cache=True)
def adopt(f, s, target: np.ndarray, order: np.ndarray) -> None:
    """Move each node (in ``order``) to its ``target`` strategy when the usage profile stays in the limit."""
    for v in order:
        old = s.assign[v]
        if target[v] == old:
            continue
        set_strategy(f, s, v, target[v])
        if s.seg_t[1] > f.limit:
            set_strategy(f, s, v, old)
