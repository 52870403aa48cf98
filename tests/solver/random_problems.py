"""Random small problems, a vectorised brute force and the definition of dominance, for the solver tests."""

from __future__ import annotations

import itertools

import numpy as np

from solver.problem import Problem


def random_problem(
    rng: np.random.Generator,
    nodes: tuple[int, int] = (2, 6),
    strategies: tuple[int, int] = (1, 3),
    with_limit: bool | None = None,
    forbidden_rate: float = 0.15,
    groups: bool = False,
    pins: bool = False,
    parallel_edges: bool = True,
) -> Problem:
    """A small random problem: integer costs, some forbidden entries, intervals (some empty), a limit."""
    n = int(rng.integers(nodes[0], nodes[1] + 1))
    counts = rng.integers(strategies[0], strategies[1] + 1, size=n)
    costs = [rng.integers(0, 50, size=c).astype(float) for c in counts]
    for c in costs:
        c[rng.random(len(c)) < forbidden_rate / 2] = np.inf
    usages = [rng.integers(0, 20, size=c) for c in counts]
    starts = rng.integers(0, 10, size=n)
    lengths = rng.integers(0, 8, size=n)
    intervals = np.stack([starts, starts + lengths], axis=1)
    edges, matrices = [], []
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    for u, v in pairs:
        copies = 1 + int(parallel_edges and rng.random() < 0.15)
        for _ in range(copies if rng.random() < 0.6 else 0):
            a, b = (u, v) if rng.random() < 0.5 else (v, u)
            matrix = rng.integers(0, 40, size=(counts[a], counts[b])).astype(float)
            matrix[rng.random(matrix.shape) < forbidden_rate] = np.inf
            edges.append((a, b))
            matrices.append(matrix)
    group_list: list[list[int]] = []
    if groups:
        by_count: dict[int, list[int]] = {}
        for i, c in enumerate(counts.tolist()):
            by_count.setdefault(c, []).append(i)
        for members in by_count.values():
            if len(members) >= 2 and rng.random() < 0.7:
                group_list.append(members[:2])
    pin_map = {}
    if pins and rng.random() < 0.7:
        node = int(rng.integers(0, n))
        pin_map[node] = int(rng.integers(0, counts[node]))
    limit = None
    if with_limit or (with_limit is None and rng.random() < 0.6):
        limit = int(rng.integers(0, 60))
    return Problem.from_lists(
        costs=costs,
        usages=usages,
        intervals=intervals,
        edges=edges,
        edge_costs=matrices,
        usage_limit=limit,
        groups=group_list,
        pins=pin_map,
        name="random",
    )


def large_problem(
    rng: np.random.Generator, nodes: int = 5_000, strategies: tuple[int, int] = (4, 12)
) -> Problem:
    """A problem no backend proves in seconds: a long chain with skip edges, like a layer graph; some
    entries forbidden, every node alive over a window, a usage limit that binds. Each node's least-using
    strategy is allowed everywhere (its edge entries finite), so that assignment proves it feasible: the
    limit is 1.5x its peak."""
    counts = rng.integers(strategies[0], strategies[1] + 1, size=nodes)
    costs = [rng.integers(0, 1000, size=c).astype(float) for c in counts]
    usages = [rng.integers(1, 100, size=c) for c in counts]
    lean = np.array([int(np.argmin(u)) for u in usages])
    for c, keep in zip(costs, lean, strict=True):
        c[rng.random(len(c)) < 0.05] = np.inf
        c[keep] = min(c[keep], 1000.0)
    starts = np.arange(nodes) + rng.integers(0, 3, size=nodes)
    intervals = np.stack([starts, starts + rng.integers(1, 40, size=nodes)], axis=1)
    edges = [(i, i + 1) for i in range(nodes - 1)]
    skips = rng.integers(0, nodes - 2, size=nodes // 2)
    edges += [(int(u), int(min(nodes - 1, u + rng.integers(2, 30)))) for u in skips]
    matrices = []
    for u, v in edges:
        matrix = rng.integers(0, 500, size=(counts[u], counts[v])).astype(float)
        matrix[rng.random(matrix.shape) < 0.05] = np.inf
        matrix[lean[u], lean[v]] = rng.integers(0, 500)
        matrices.append(matrix)
    lean_usage = np.array([u[k] for u, k in zip(usages, lean, strict=True)])
    change = np.zeros(int(intervals.max()) + 1, dtype=np.int64)
    np.add.at(change, intervals[:, 0], lean_usage)
    np.add.at(change, intervals[:, 1], -lean_usage)
    limit = int(1.5 * np.cumsum(change).max())
    return Problem.from_lists(
        costs=costs,
        usages=usages,
        intervals=intervals,
        edges=edges,
        edge_costs=matrices,
        usage_limit=limit,
        name="large-random",
    )


def brute_force(problem: Problem) -> tuple[float | None, np.ndarray | None]:
    """(optimal cost, one optimal assignment) by enumerating every assignment; (None, None) if infeasible."""
    counts = problem.strategy_counts.tolist()
    assignments = np.array(list(itertools.product(*[range(c) for c in counts])), dtype=np.int64)
    cost = problem.costs[problem.node_offsets[:-1] + assignments].sum(axis=1)
    for e in range(problem.num_edges):
        u, v = problem.edge_nodes[e]
        cost = cost + problem.edge_matrix(e)[assignments[:, u], assignments[:, v]]
    ok = np.isfinite(cost)
    if problem.usage_limit is not None:
        used = problem.usages[problem.node_offsets[:-1] + assignments]
        for t in range(int(problem.intervals.max(initial=0)) + 1):
            alive = (problem.intervals[:, 0] <= t) & (t < problem.intervals[:, 1])
            ok &= used[:, alive].sum(axis=1) <= problem.usage_limit
    for members in problem.groups:
        ok &= (assignments[:, list(members)] == assignments[:, [members[0]]]).all(axis=1)
    for node, strategy in problem.pins.items():
        ok &= assignments[:, node] == strategy
    if not ok.any():
        return None, None
    best = int(np.flatnonzero(ok)[np.argmin(cost[ok])])
    return float(cost[best]), assignments[best]


def beaten_by_definition(values: np.ndarray) -> np.ndarray:
    """Row ``a`` is beaten when some other row ``b`` is ``<=`` everywhere and ``<`` somewhere or comes first.

    Every comparison with NaN is false, so a row with NaN neither beats nor is beaten.
    """
    count = len(values)
    beaten = np.zeros(count, dtype=bool)
    for a in range(count):
        for b in range(count):
            if b != a and all(values[b] <= values[a]) and (any(values[b] < values[a]) or b < a):
                beaten[a] = True
    return beaten


def tight_problem(rng: np.random.Generator, nodes: tuple[int, int] = (5, 7)) -> Problem:
    """A small problem where memory binds hard: a smaller strategy costs more, every node is alive over
    overlapping windows, and the limit sits halfway between the least peak any assignment reaches and the
    peak of the memory-free optimum, so that optimum breaks it."""
    n = int(rng.integers(nodes[0], nodes[1] + 1))
    counts = rng.integers(2, 4, size=n)
    usages = [rng.integers(1, 30, size=c) for c in counts]
    costs = [(40 - u + rng.integers(0, 8, size=len(u))).astype(float) for u in usages]
    starts = rng.integers(0, 4, size=n)
    intervals = np.stack([starts, starts + rng.integers(3, 7, size=n)], axis=1)
    edges = [(i, i + 1) for i in range(n - 1)] + [(0, n - 1)]
    matrices = [rng.integers(0, 12, size=(counts[u], counts[v])).astype(float) for u, v in edges]
    free = Problem.from_lists(costs, usages, intervals, edges, matrices)
    _, optimum = brute_force(free)
    assert optimum is not None
    lean = np.array([int(np.argmin(u)) for u in usages])
    limit = (_peak(free, lean) + _peak(free, optimum)) // 2
    return free.replace(usage_limit=int(limit), name="tight-random")


def _peak(problem: Problem, assignment: np.ndarray) -> int:
    used = problem.usages[problem.node_offsets[:-1] + assignment]
    horizon = int(problem.intervals.max(initial=0)) + 1
    starts, ends = problem.intervals[:, 0], problem.intervals[:, 1]
    return max(int(used[(starts <= t) & (t < ends)].sum()) for t in range(horizon))
