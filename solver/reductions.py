"""Optimum-preserving reductions of a `Problem`, run before it is handed to a backend.

Every reduction returns a `Problem` with the *same node indices*: nodes are never deleted (a node reduced to
one strategy stays, isolated, as a constant), so the way back is, per node, the original strategy index of
each kept strategy (`Reduced.kept`). For every solution ``r`` of the reduced problem,
``cost(original, lift(r)) == cost(reduced, r) + constant`` and the memory profile is the same, because every
kept strategy keeps its usage. Each reduction also keeps at least one optimal solution of the original, so
``optimum(reduced) + constant == optimum(original)``. Why each one keeps the optimum:

- **forbidden**: a strategy with an infinite node cost, an all-infinite row (column) in an incident edge
  matrix, or an infinite diagonal entry on an edge inside its group can never be part of a finite solution.
  Removal is per group (members share the strategy index), iterated until nothing changes; a node left with
  no strategy raises `InfeasibleError` naming it.
- **pins**: a pinned node can only take its pinned strategy, so every other strategy of it (and, index for
  index, of every member of its group) is removed; the pin then holds by construction and is dropped.
- **single-strategy fold**: when node ``u`` has one strategy, edge ``(u, w)`` costs ``M[0, s_w]``, a function
  of ``s_w`` alone: it is added to ``w``'s node costs and the edge removed. The (finite) node cost of ``u``
  moves to `Reduced.constant`; ``u`` stays, isolated, with cost 0 and its usage.
- **parallel edges**: edges joining the same two nodes add up; they become one edge (transposed as needed).
- **group edges**: an edge inside a group only ever sees equal indices, so it costs its diagonal, which is
  added to one endpoint's node costs.
- **follow merge**: when the finite entries of edge ``(u, v)`` form a permutation ``pi`` (square, exactly one
  finite entry per row and column, more than one strategy), every finite solution has ``s_v = pi(s_u)``.
  One side's group is relabelled so that ``pi`` becomes the identity, the two groups are united (groups are
  how a `Problem` says "same strategy index"; `compact` folds them into one super node) and the edge, now
  inside the group, costs its diagonal (see group edges). Pins are kept in original indices, so a pin on
  either side constrains the merged group.
- **dominated**: strategy ``a`` of a group is removed when another strategy ``b`` is no worse in the summed
  node cost (plus the diagonals of edges inside the group), in the usage of every member that is alive while
  there is a usage limit, and in every entry of every edge leaving the group; exact ties keep the lower index.
  Any solution using ``a`` becomes no worse and no more memory hungry with ``b``, whatever the other nodes
  take, so removals at many groups at once are safe. Groups holding a pin are skipped while pins remain.
  `solver.dominance` finds the dominated strategies of a group.

`reduce` runs pins once, then the others in the order above until none changes anything; each
`ReductionStep` aggregates all passes of one reduction.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from solver.dominance import dominated_rows
from solver.errors import InfeasibleError
from solver.problem import Problem

FORBIDDEN = "forbidden"
PINS = "pins"
FOLD = "single-strategy fold"
PARALLEL = "parallel edges"
GROUP_EDGES = "group edges"
FOLLOW = "follow merge"
DOMINATED = "dominated"

#: Every reduction, in the order one pass runs them (pins run once, before the others).
ALL_REDUCTIONS: tuple[str, ...] = (PINS, FORBIDDEN, PARALLEL, GROUP_EDGES, FOLD, FOLLOW, DOMINATED)

#: The change stamp every node starts with.
_START_TICK = 1


@dataclass(frozen=True)
class ReductionStep:
    """What one reduction removed, summed over all its passes."""

    name: str
    strategies_removed: int
    edges_removed: int
    nodes_merged: int  # follow merges made: each joins two groups into one (one super node fewer)
    seconds: float


@dataclass(frozen=True)
class Reduced:
    """A reduced problem and the way back to the original one (see the module docstring)."""

    problem: Problem
    kept: list[np.ndarray]  # per node: original strategy index of each reduced strategy (int64)
    constant: float  # cost moved out of the problem: original cost = reduced cost + constant
    steps: list[ReductionStep]

    def lift(self, solution: np.ndarray) -> np.ndarray:
        """The original-problem solution of a reduced-problem solution (one index per node)."""
        chosen = np.asarray(solution, dtype=np.int64)
        flat = self._flat_kept
        return flat[self.problem.node_offsets[:-1] + chosen]

    def project(self, solution: np.ndarray) -> np.ndarray | None:
        """The reduced indices of an original solution; ``None`` when it uses a removed strategy."""
        chosen = np.asarray(solution, dtype=np.int64)
        node = self.problem.strategy_node
        hits = np.flatnonzero(self._flat_kept == chosen[node])
        if len(hits) != self.problem.num_nodes:
            return None
        return hits - self.problem.node_offsets[node[hits]]

    @property
    def _flat_kept(self) -> np.ndarray:
        return np.concatenate(self.kept) if self.kept else np.zeros(0, dtype=np.int64)

    def summary(self) -> str:
        """One line per reduction: what it removed and how long it took."""
        lines = [f"constant {self.constant:g}"]
        for step in self.steps:
            lines.append(
                f"{step.name}: -{step.strategies_removed} strategies, -{step.edges_removed} edges, "
                f"{step.nodes_merged} merges, {step.seconds:.2f}s"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- working state
@dataclass
class _Work:
    """Mutable per-node / per-edge state of a problem that the reductions edit.

    Its arrays start as read-only views of the problem's (nothing is copied): every edit replaces an array
    and never writes into one. ``stamp[i]`` is the tick of the last change that can affect node ``i`` (its
    strategies, costs or incident edges); each reduction only revisits nodes changed since it last ran.
    """

    costs: list[np.ndarray]
    usages: list[np.ndarray]
    kept: list[np.ndarray]
    alive: np.ndarray  # bool per node: non-empty interval
    has_limit: bool
    eu: list[int]
    ev: list[int]
    mats: list[np.ndarray | None]  # None once the edge is removed
    incident: list[set[int]]
    group_of: np.ndarray  # node -> group id (the id of one member)
    members: dict[int, list[int]]
    pins: dict[int, int]  # node -> original strategy index
    original: Problem
    constant: float = 0.0
    tick: int = _START_TICK
    stamp: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def of(cls, problem: Problem) -> _Work:
        n = problem.num_nodes
        group_of = np.arange(n, dtype=np.int64)
        members = {i: [i] for i in range(n)}
        for group in problem.groups:
            head = group[0]
            for node in group[1:]:
                group_of[node] = head
                del members[node]
            members[head] = list(group)
        incident: list[set[int]] = [set() for _ in range(n)]
        eu, ev = problem.edge_nodes[:, 0].tolist(), problem.edge_nodes[:, 1].tolist()
        for e, (u, v) in enumerate(zip(eu, ev, strict=True)):
            incident[u].add(e)
            incident[v].add(e)
        starts, ends = problem.node_offsets[:-1].tolist(), problem.node_offsets[1:].tolist()
        costs, usages = _read_only(problem.costs), _read_only(problem.usages)
        return cls(
            costs=[costs[s:t] for s, t in zip(starts, ends, strict=True)],
            usages=[usages[s:t] for s, t in zip(starts, ends, strict=True)],
            kept=[np.arange(c, dtype=np.int64) for c in problem.strategy_counts.tolist()],
            alive=problem.intervals[:, 1] > problem.intervals[:, 0],
            has_limit=problem.usage_limit is not None,
            eu=eu,
            ev=ev,
            mats=_edge_matrices(problem),
            incident=incident,
            group_of=group_of,
            members=members,
            pins=dict(problem.pins),
            original=problem,
            stamp=np.full(n, _START_TICK, dtype=np.int64),
        )

    # ----------------------------------------------------------------- bookkeeping
    def touch(self, nodes: Iterable[int]) -> None:
        self.tick += 1
        for node in nodes:
            self.stamp[node] = self.tick

    def changed_since(self, tick: int) -> np.ndarray:
        return np.flatnonzero(self.stamp > tick)

    def count(self, node: int) -> int:
        return len(self.costs[node])

    def other(self, e: int, node: int) -> int:
        return self.ev[e] if self.eu[e] == node else self.eu[e]

    def oriented(self, e: int, node: int) -> np.ndarray:
        """Edge matrix with one row per strategy of ``node``."""
        matrix = self.mats[e]
        assert matrix is not None
        return matrix if self.eu[e] == node else matrix.T

    def group(self, node: int) -> list[int]:
        return self.members[int(self.group_of[node])]

    def neighbourhood(self, nodes: Iterable[int]) -> set[int]:
        around: set[int] = set()
        for node in nodes:
            around.add(node)
            around.update(self.other(e, node) for e in self.incident[node])
        return around

    # ----------------------------------------------------------------- edits
    def remove_edge(self, e: int) -> None:
        u, v = self.eu[e], self.ev[e]
        self.incident[u].discard(e)
        self.incident[v].discard(e)
        self.mats[e] = None
        self.touch((u, v))

    def reorder_group(self, node: int, order: np.ndarray) -> None:
        """Keep (and reorder) the strategies ``order`` of every member of ``node``'s group."""
        group = self.group(node)
        for member in group:
            self.costs[member] = self.costs[member][order]
            self.usages[member] = self.usages[member][order]
            self.kept[member] = self.kept[member][order]
            for e in self.incident[member]:
                matrix = self.mats[e]
                assert matrix is not None
                self.mats[e] = matrix[order, :] if self.eu[e] == member else np.take(matrix, order, axis=1)
        self.touch(self.neighbourhood(group))

    def restrict_group(self, node: int, keep: np.ndarray) -> int:
        """Keep the strategies where ``keep`` holds, in every member; the number of strategies removed."""
        removed = int(len(keep) - np.count_nonzero(keep))
        if not removed:
            return 0
        group = self.group(node)
        if not keep.any():
            raise InfeasibleError(f"every strategy of node {node}{_group_text(group)} is forbidden")
        self.reorder_group(node, np.flatnonzero(keep))
        for member in group:
            pinned = self.pins.get(member)
            if pinned is not None and pinned not in self.kept[member]:
                raise InfeasibleError(f"node {member} is pinned to strategy {pinned}, which is forbidden")
        return removed * len(group)

    def unite(self, a: int, b: int) -> list[int]:
        """Put the groups of nodes ``a`` and ``b`` (same strategy count) into one; the members that moved."""
        ga, gb = int(self.group_of[a]), int(self.group_of[b])
        if len(self.members[ga]) < len(self.members[gb]):
            ga, gb = gb, ga
        moved = self.members.pop(gb)
        self.group_of[moved] = ga
        self.members[ga].extend(moved)
        self.touch([*moved, ga])
        return moved

    # ----------------------------------------------------------------- result
    def to_problem(self, original: Problem, keep_pins: bool) -> Problem:
        counts = np.array([len(c) for c in self.costs], dtype=np.int64)
        edges = [e for e, matrix in enumerate(self.mats) if matrix is not None]
        edge_sizes = np.array([self.mats[e].size for e in edges], dtype=np.int64)  # type: ignore[union-attr]
        groups = tuple(
            tuple(sorted(group)) for group in self.members.values() if len(group) > 1 and counts[group[0]] > 1
        )
        pins = {}
        if keep_pins:
            pins = {node: int(np.flatnonzero(self.kept[node] == s)[0]) for node, s in self.pins.items()}
        return original.replace(
            node_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            costs=_concat(self.costs, np.float64),
            usages=_concat(self.usages, np.int64),
            edge_nodes=np.array([[self.eu[e], self.ev[e]] for e in edges], dtype=np.int64).reshape(-1, 2),
            edge_offsets=np.concatenate([[0], np.cumsum(edge_sizes)]).astype(np.int64),
            edge_costs=_concat([self.mats[e].ravel() for e in edges], np.float64),  # type: ignore[union-attr]
            groups=tuple(sorted(groups)),
            pins=pins,
        )


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def _edge_matrices(problem: Problem) -> list[np.ndarray | None]:
    """Read-only views of every edge cost matrix."""
    flat = _read_only(problem.edge_costs)
    offsets = problem.edge_offsets.tolist()
    counts = problem.strategy_counts
    rows, cols = counts[problem.edge_nodes[:, 0]].tolist(), counts[problem.edge_nodes[:, 1]].tolist()
    return [flat[offsets[e] : offsets[e + 1]].reshape(rows[e], cols[e]) for e in range(problem.num_edges)]


def _concat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def _group_text(group: list[int]) -> str:
    if len(group) == 1:
        return ""
    shown = ", ".join(str(m) for m in sorted(group)[:8])
    return f" (group of nodes {shown}{', ...' if len(group) > 8 else ''})"


@dataclass
class _Tally:
    """Running totals of one reduction."""

    strategies: int = 0
    edges: int = 0
    merges: int = 0
    seconds: float = 0.0
    last_tick: int = 0
    checked: dict[int, int] = field(default_factory=dict)  # group id -> tick at which it was last checked

    def step(self, name: str) -> ReductionStep:
        return ReductionStep(name, self.strategies, self.edges, self.merges, self.seconds)


# --------------------------------------------------------------------------- the reductions
def _heads(work: _Work, nodes: Iterable[int]) -> list[int]:
    """One node per group among ``nodes`` (the group id), sorted."""
    return sorted({int(work.group_of[node]) for node in nodes})


def _forbidden(work: _Work, tally: _Tally) -> None:
    """Remove, per group, strategies that cannot be in any finite solution, until nothing changes."""
    if tally.last_tick == 0:
        _forbidden_at_start(work, tally)
    while True:
        heads = _heads(work, work.changed_since(tally.last_tick))
        tally.last_tick = work.tick
        if not heads:
            return
        for head in heads:
            tally.strategies += work.restrict_group(head, _possible(work, head))


def _forbidden_at_start(work: _Work, tally: _Tally) -> None:
    """The first pass, vectorised over the original arrays; groups are checked one by one.

    Nodes changed since the start (by pins, or by this pass) are left for the incremental passes.
    """
    possible = _finite_support(work.original)
    offsets = work.original.node_offsets
    for head, group in list(work.members.items()):
        keep = _possible(work, head) if len(group) > 1 else possible[offsets[head] + work.kept[head]]
        tally.strategies += work.restrict_group(head, keep)
    tally.last_tick = _START_TICK


def _finite_support(problem: Problem) -> np.ndarray:
    """Per flat strategy: a finite node cost and, on every incident edge, a finite entry in its row/column."""
    possible = np.isfinite(problem.costs)
    if not problem.num_edges:
        return possible
    counts = problem.strategy_counts
    u, v = problem.edge_nodes[:, 0], problem.edge_nodes[:, 1]
    _mark_unsupported(
        problem.edge_costs,
        problem.edge_offsets,
        counts[u],
        counts[v],
        problem.node_offsets[u],
        problem.node_offsets[v],
        possible,
    )
    return possible


@njit(cache=True)
def _mark_unsupported(costs, offsets, rows, cols, row_start, col_start, possible):
    """Clear ``possible`` for every edge row (column) without a finite entry; matrices are row-major."""
    for e in range(len(rows)):
        matrix = costs[offsets[e] : offsets[e + 1]].reshape((rows[e], cols[e]))
        row_ok, column_ok = _finite_lines(matrix)
        for i in range(rows[e]):
            possible[row_start[e] + i] &= row_ok[i]
        for j in range(cols[e]):
            possible[col_start[e] + j] &= column_ok[j]


@njit(cache=True)
def _finite_lines(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether each row, and each column, of ``matrix`` holds a finite entry.

    Rows are read in full only until every column has shown a finite entry; after that a row is read up
    to its first finite entry, so a mostly finite matrix costs about one entry per row.
    """
    rows, cols = matrix.shape
    row_ok = np.zeros(rows, dtype=np.bool_)
    column_ok = np.zeros(cols, dtype=np.bool_)
    columns_left = cols
    for i in range(rows):
        if columns_left:
            found = False
            for j in range(cols):
                finite = np.isfinite(matrix[i, j])
                found |= finite
                column_ok[j] |= finite
            row_ok[i] = found
            if found:
                columns_left = cols - np.count_nonzero(column_ok)
        else:
            for j in range(cols):
                if np.isfinite(matrix[i, j]):
                    row_ok[i] = True
                    break
    return row_ok, column_ok


def _possible(work: _Work, head: int) -> np.ndarray:
    group = work.group(head)
    keep = np.isfinite(work.costs[head])
    for member in group:
        if member != head:
            keep &= np.isfinite(work.costs[member])
        for e in work.incident[member]:
            matrix = work.mats[e]
            assert matrix is not None
            row_ok, column_ok = _finite_lines(matrix)
            keep &= row_ok if work.eu[e] == member else column_ok
            if work.group_of[work.other(e, member)] == head:
                keep &= np.isfinite(np.diagonal(matrix))
    return keep


def _pins(work: _Work, tally: _Tally) -> None:
    """Restrict every pinned node's group to the pinned strategy; the pins then hold by construction."""
    for node, strategy in sorted(work.pins.items()):
        tally.strategies += work.restrict_group(node, work.kept[node] == strategy)
    work.pins = {}


def _parallel(work: _Work, tally: _Tally) -> None:
    """Sum edges joining the same two nodes into the first of them."""
    nodes = work.changed_since(tally.last_tick)
    tally.last_tick = work.tick
    first: dict[tuple[int, int], int] = {}
    for e in sorted({e for node in nodes.tolist() for e in work.incident[node]}):
        u, v = work.eu[e], work.ev[e]
        key = (min(u, v), max(u, v))
        keeper = first.setdefault(key, e)
        if keeper != e:
            work.mats[keeper] = work.mats[keeper] + work.oriented(e, work.eu[keeper])
            work.remove_edge(e)
            tally.edges += 1


def _group_edges(work: _Work, tally: _Tally) -> None:
    """Fold every edge inside a group into node costs (it only ever costs its diagonal)."""
    nodes = work.changed_since(tally.last_tick)
    tally.last_tick = work.tick
    tally.edges += _fold_inner_edges(work, nodes.tolist())


def _fold_inner_edges(work: _Work, nodes: Iterable[int]) -> int:
    """Add the diagonal of every edge at ``nodes`` that lies inside a group to node costs; the count."""
    same = work.group_of
    inner = sorted({e for node in nodes for e in work.incident[node] if same[work.eu[e]] == same[work.ev[e]]})
    for e in inner:
        matrix = work.mats[e]
        assert matrix is not None
        work.costs[work.eu[e]] = work.costs[work.eu[e]] + np.diagonal(matrix)
        work.remove_edge(e)
    return len(inner)


def _fold(work: _Work, tally: _Tally) -> None:
    """Fold the edges of single-strategy nodes into their neighbours; move their costs to the constant."""
    nodes = [i for i in work.changed_since(tally.last_tick).tolist() if work.count(i) == 1]
    tally.last_tick = work.tick
    affected = set(nodes)
    for node in nodes:
        for e in sorted(work.incident[node]):
            other = work.other(e, node)
            work.costs[other] = work.costs[other] + work.oriented(e, other)[:, 0]
            work.remove_edge(e)
            tally.edges += 1
            affected.add(other)
    for node in sorted(affected):
        cost = work.costs[node]
        if len(cost) == 1 and math.isfinite(cost[0]) and cost[0] != 0:
            work.constant += float(cost[0])
            work.costs[node] = np.zeros(1)


def _follow(work: _Work, tally: _Tally) -> None:
    """Merge the endpoints of edges whose finite entries form a permutation into one group."""
    nodes = work.changed_since(tally.last_tick)
    tally.last_tick = work.tick
    candidates = sorted({e for node in nodes.tolist() for e in work.incident[node]})
    for e in candidates:
        matrix = work.mats[e]
        if matrix is None or not _is_follow(work, e, matrix):
            continue
        tally.merges += 1
        tally.edges += _fold_inner_edges(work, _merge(work, e, matrix))


def _is_follow(work: _Work, e: int, matrix: np.ndarray) -> bool:
    u, v = work.eu[e], work.ev[e]
    size = matrix.shape[0]
    if size < 2 or matrix.shape[1] != size or work.group_of[u] == work.group_of[v]:
        return False
    return _one_finite_per_line(matrix)


@njit(cache=True)
def _one_finite_per_line(matrix: np.ndarray) -> bool:
    """Whether every row and every column of a square matrix holds exactly one finite entry; stops at the
    first row with two (most matrices are mostly finite, so that is within the first row)."""
    size = matrix.shape[0]
    column_taken = np.zeros(size, dtype=np.bool_)
    for i in range(size):
        found = -1
        for j in range(size):
            if np.isfinite(matrix[i, j]):
                if found >= 0:
                    return False
                found = j
        if found < 0 or column_taken[found]:
            return False
        column_taken[found] = True
    return True


def _merge(work: _Work, e: int, matrix: np.ndarray) -> list[int]:
    """Relabel the smaller side so that the permutation of edge ``e`` becomes the identity, then unite.

    Returns the members that joined the other group (every edge now inside the group touches one of them).
    """
    u, v = work.eu[e], work.ev[e]
    column_of_row = np.argmax(np.isfinite(matrix), axis=1)
    if len(work.group(v)) <= len(work.group(u)):
        work.reorder_group(v, column_of_row)
    else:
        row_of_column = np.empty_like(column_of_row)
        row_of_column[column_of_row] = np.arange(len(column_of_row))
        work.reorder_group(u, row_of_column)
    return work.unite(u, v)


def _dominated(work: _Work, tally: _Tally) -> None:
    """Remove, per group, strategies dominated by another strategy of the same group.

    Of the groups changed since the last pass, a group is checked only when something it depends on changed
    after its own last check: that check left strategies none of which beats another, so the same features
    would give nothing. (A group checked late in a pass has already seen the pass's earlier removals.)
    """
    heads = _heads(work, work.changed_since(tally.last_tick))
    tally.last_tick = work.tick
    scratch = _Scratch()
    for head in heads:
        group = work.group(head)
        if work.count(head) < 2 or any(member in work.pins for member in group):
            continue
        if work.stamp[group].max() <= tally.checked.get(head, 0):
            continue
        removed = dominated_rows(_features(work, head, scratch))
        if removed.any():
            tally.strategies += work.restrict_group(head, ~removed)
        tally.checked[head] = work.tick


def _features(work: _Work, head: int, scratch: _Scratch) -> np.ndarray:
    """One row per strategy of the group: everything a strategy's choice changes, lower is better.

    Written into ``scratch``: one buffer serves every group, so it is allocated once and stays in cache.
    """
    group = work.group(head)
    cost = np.zeros(work.count(head))
    columns: list[np.ndarray] = []
    for member in group:
        cost = cost + work.costs[member]
        if work.has_limit and work.alive[member]:
            columns.append(work.usages[member][:, None])
        for e in work.incident[member]:
            if work.group_of[work.other(e, member)] != head:
                columns.append(work.oriented(e, member))
            elif work.eu[e] == member:
                cost = cost + np.diagonal(work.mats[e])  # type: ignore[arg-type]
    features = scratch.matrix(len(cost), 1 + sum(block.shape[1] for block in columns))
    features[:, 0] = cost
    start = 1
    for block in columns:
        features[:, start : start + block.shape[1]] = block
        start += block.shape[1]
    return features


class _Scratch:
    """A float64 buffer, grown on demand, that hands out matrices of any shape (overwriting the last one)."""

    def __init__(self) -> None:
        self.buffer = np.empty(0)

    def matrix(self, rows: int, columns: int) -> np.ndarray:
        if rows * columns > len(self.buffer):
            self.buffer = np.empty(max(rows * columns, 2 * len(self.buffer)))
        return self.buffer[: rows * columns].reshape(rows, columns)


# --------------------------------------------------------------------------- driver
_Reduction = Callable[[_Work, _Tally], None]

_PASS: tuple[tuple[str, _Reduction], ...] = (
    (FORBIDDEN, _forbidden),
    (PARALLEL, _parallel),
    (GROUP_EDGES, _group_edges),
    (FOLD, _fold),
    (FOLLOW, _follow),
    (DOMINATED, _dominated),
)


def reduce(problem: Problem, *, enabled: Collection[str] | None = None) -> Reduced:
    """Apply the enabled reductions (all by default) to a fixpoint; see the module docstring.

    Raises `InfeasibleError` when a node loses every strategy (the original problem is then infeasible) and
    `ValueError` for an unknown reduction name.
    """
    chosen = set(ALL_REDUCTIONS if enabled is None else enabled)
    unknown = chosen - set(ALL_REDUCTIONS)
    if unknown:
        raise ValueError(f"unknown reductions {sorted(unknown)}; known: {', '.join(ALL_REDUCTIONS)}")
    work = _Work.of(problem)
    tallies = {name: _Tally() for name in ALL_REDUCTIONS if name in chosen}
    if PINS in tallies:
        _timed(_pins, work, tallies[PINS])
    while True:
        tick = work.tick
        for name, reduction in _PASS:
            if name in tallies:
                _timed(reduction, work, tallies[name])
        if work.tick == tick:
            break
    return Reduced(
        problem=work.to_problem(problem, keep_pins=PINS not in tallies),
        kept=work.kept,
        constant=work.constant,
        steps=[tallies[name].step(name) for name in ALL_REDUCTIONS if name in tallies],
    )


def _timed(reduction: _Reduction, work: _Work, tally: _Tally) -> None:
    start = time.perf_counter()
    reduction(work, tally)
    tally.seconds += time.perf_counter() - start
