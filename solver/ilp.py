r"""The whole-graph integer program, built vectorised from a `CompactProblem` as one sparse matrix.

Sets: super nodes ``k`` with strategies ``s in S_k`` (only *free* nodes, ``|S_k| > 1``, get variables; a node
with one strategy is a constant); edges ``e = (a, b)`` with cost matrix ``C_e``; memory terms ``t`` (a member
node: super node ``k(t)``, interval ``[start_t, end_t)``, usage ``u_t[s]``); *rows of the memory profile*
``r``: the time steps where the set of live terms is maximal (a start followed by an end in the sweep), so
every other time step is dominated by one of them.

Variables (`build_program`):
- ``x[k, s] in {0, 1}``: node ``k`` takes strategy ``s`` (upper bound 0 where the cost is infinite);
- ``y[e, i, j] in [0, 1]``: edge ``e`` takes the pair ``(i, j)``; created only for finite ``C_e[i, j]`` and
  only when both ends are free (an edge with a constant end is folded into the other end's costs);
  integral whenever ``x`` is;
- ``m[q] >= 0``: the usage carried by node ``q`` of a segment tree over the memory rows (shared terms).

Objective: ``min sum_k sum_s c[k, s] x[k, s] + sum_e sum_{i, j} C_e[i, j] y[e, i, j] + constant``.

Constraints, one family per function:
- ``one_hot`` (`_one_hot_rows`): ``sum_s x[k, s] = 1`` for every free node;
- ``edge_out`` / ``edge_in`` (`_edge_rows`): ``sum_j y[e, i, j] = x[a, i]`` for every ``i``, and
  ``sum_i y[e, i, j] = x[b, j]`` for every ``j``; a forbidden pair has no ``y``, so it cannot be chosen;
- ``memory_def`` (`_memory_rows`): ``m[q] = sum_{t in q} sum_s (u_t[s] - min_s u_t) x[k(t), s]`` (bytes over
  `memory_unit`, a power of two that brings the limit near 2**16, so the LP stays well scaled), where each
  term's row range ``[first row in its interval, last row]`` is split into O(log R) segment-tree nodes
  ``q`` -- terms whose intervals cover the same rows share one ``m``;
- ``memory_cap`` (`_memory_rows`): ``sum_{q an ancestor of leaf r} m[q] <= limit - base[r]`` for every
  memory row ``r``, ``base[r]`` being the constant usage at ``r`` (constant nodes and every term's minimum).

Every cost is in the problem's unit (seconds for plans, integers for IOPDDL); usages in bytes.

Each program also carries its `MemoryProfile`: every ``memory_cap`` row the problem could need, in direct
form (``sum_t sum_s (u_t[s] - min u_t) x[k(t), s] <= limit - base[r]``, no ``m``), so that a backend that
solves the relaxation itself (HiGHS) can start without memory rows and add the ones its LP solutions violate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from solver.compact import CompactProblem
from solver.errors import InfeasibleError

#: Values below this count as 0 when reading a binary from a backend.
BINARY_TOLERANCE = 1e-6


@dataclass(frozen=True, eq=False)
class IntegerProgram:
    """``min objective . z + constant  s.t.  row_lower <= matrix z <= row_upper, col bounds, integrality``."""

    objective: np.ndarray
    constant: float
    matrix: sp.csr_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    is_integer: np.ndarray
    x_offset: np.ndarray  # int64[K]: first x column of each super node, -1 for a constant node
    strategy_counts: np.ndarray
    row_families: dict[str, tuple[int, int]]
    col_families: dict[str, tuple[int, int]]
    y_edge: np.ndarray  # per y column: its edge (index into the free-edge list)
    y_pair: np.ndarray  # per y column: (i, j)
    free_edges: np.ndarray  # int64[F, 2] super-node pairs of the edges with y variables
    memory_parts: sp.csr_matrix  # m[q] = memory_parts[q] . z  (for warm starts)
    build_seconds: dict[str, float]
    memory_profile: MemoryProfile | None = None  # every memory row the problem could need, direct form

    @property
    def num_variables(self) -> int:
        return len(self.objective)

    @property
    def num_constraints(self) -> int:
        return self.matrix.shape[0]

    def assignment(self, values: np.ndarray) -> np.ndarray:
        """The super-node assignment encoded by a column vector (argmax of each node's ``x``)."""
        chosen = np.zeros(len(self.x_offset), dtype=np.int64)
        free = np.flatnonzero(self.x_offset >= 0)
        if len(free) == 0:
            return chosen
        counts = self.strategy_counts[free]
        owner = np.repeat(np.arange(len(free)), counts)
        order = np.lexsort((-values[: len(owner)], owner))  # by node, largest value first, stable
        chosen[free] = order[np.searchsorted(owner[order], np.arange(len(free)))] - self.x_offset[free]
        return chosen

    def columns(self, assignment: np.ndarray) -> np.ndarray | None:
        """The full column vector of an assignment (for warm starts); None if it uses a missing ``y``."""
        values = np.zeros(self.num_variables)
        free = self.x_offset >= 0
        values[self.x_offset[free] + assignment[free]] = 1.0
        if len(self.free_edges):
            i = assignment[self.free_edges[self.y_edge, 0]]
            j = assignment[self.free_edges[self.y_edge, 1]]
            chosen = (self.y_pair[:, 0] == i) & (self.y_pair[:, 1] == j)
            y_start = self.col_families["y"][0]
            values[y_start : y_start + len(chosen)] = chosen
            if np.count_nonzero(chosen) != len(self.free_edges):
                return None
        m_start, m_stop = self.col_families["m"]
        if m_stop > m_start:
            values[m_start:m_stop] = self.memory_parts @ values
        return values


@dataclass(frozen=True, eq=False)
class MemoryProfile:
    """Every ``memory_cap`` row the problem could need (`binding_memory_times`), in direct form
    ``sum_t sum_s (u_t[s] - min_s u_t) x[k(t), s] <= limit - base[r]`` (in `memory_unit`s), so that a
    backend can check a solution -- fractional or not -- against all of them and add the ones it violates.
    """

    times: np.ndarray  # int64[R]
    term_columns: sp.csr_matrix  # [T, columns]: each term's usage over its minimum, on its node's x columns
    first: np.ndarray  # int64[T]: the first row the term is live at
    stop: np.ndarray  # int64[T]: the row after its last
    upper: np.ndarray  # float64[R]

    def usage(self, values: np.ndarray) -> np.ndarray:
        """The left-hand side of every row for the column vector ``values``."""
        delta = np.zeros(len(self.times) + 1)
        per_term = self.term_columns @ values
        np.add.at(delta, self.first, per_term)
        np.add.at(delta, self.stop, -per_term)
        return np.cumsum(delta)[: len(self.times)]

    def over(self, values: np.ndarray, tolerance: float = 1e-6) -> np.ndarray:
        """Indices of the rows ``values`` exceeds by more than ``tolerance`` (relative), worst first."""
        excess = self.usage(values) - self.upper
        over = np.flatnonzero(excess > tolerance * np.maximum(1.0, np.abs(self.upper)))
        return over[np.argsort(-excess[over], kind="stable")]

    def rows(self, indices: np.ndarray) -> sp.csr_matrix:
        """The rows ``indices`` as a sparse matrix over the program's columns."""
        live = [np.flatnonzero((self.first <= r) & (self.stop > r)) for r in np.asarray(indices).tolist()]
        sizes = [len(terms) for terms in live]
        cover = sp.csr_matrix(
            (
                np.ones(sum(sizes)),
                (np.repeat(np.arange(len(live)), sizes), np.concatenate([np.zeros(0, np.int64), *live])),
            ),
            shape=(len(live), self.term_columns.shape[0]),
        )
        return sp.csr_matrix(cover @ self.term_columns)


def memory_profile(
    problem: CompactProblem, free: np.ndarray, x_offset: np.ndarray, num_cols: int
) -> MemoryProfile | None:
    """The `MemoryProfile` of ``problem`` over the times `binding_memory_times` names (None: no row)."""
    needed = binding_memory_times(problem)
    if len(needed) == 0 or not any(u.max() > 0 for u in problem.term_usages):
        return None
    times, layout = _memory_layout(problem, needed)
    varying = (layout.first < layout.stop) & free[layout.term_node] & (layout.usage_max > layout.usage_min)
    terms = np.flatnonzero(varying)
    unit = memory_unit(problem.usage_limit)
    extra = [(layout.usages[t] - layout.usage_min[t]).astype(np.float64) / unit for t in terms.tolist()]
    sizes = np.array([len(u) for u in extra], dtype=np.int64)
    cols = np.repeat(x_offset[layout.term_node[terms]], sizes) + concatenated_ranges(sizes)
    term_columns = sp.csr_matrix(
        (np.concatenate(extra) if extra else np.zeros(0), (np.repeat(np.arange(len(terms)), sizes), cols)),
        shape=(len(terms), num_cols),
    )
    upper = (int(problem.usage_limit or 0) - layout.base).astype(np.float64) / unit
    return MemoryProfile(times, term_columns, layout.first[terms], layout.stop[terms], upper)


def build_program(problem: CompactProblem, memory_times: np.ndarray | None = None) -> IntegerProgram:
    """State the integer program of the module docstring for `problem`.

    ``memory_times``: the time steps that get a ``memory_cap`` row (default: every maximal one). A subset
    states a relaxation (`solver.solve` adds the rows a solution violates, see `binding_memory_times`).
    """
    timings: dict[str, float] = {}
    started = time.perf_counter()
    counts = problem.strategy_counts
    free = counts > 1
    node_costs, constant = _fold_constant_ends(problem, free)
    x_offset = np.full(len(counts), -1, dtype=np.int64)
    x_offset[free] = np.concatenate([[0], np.cumsum(counts[free])[:-1]]) if free.any() else []
    num_x = int(counts[free].sum())
    x_cost = np.concatenate([node_costs[k] for k in np.flatnonzero(free)]) if num_x else np.zeros(0)
    x_upper = np.where(np.isfinite(x_cost), 1.0, 0.0)
    x_cost = np.where(np.isfinite(x_cost), x_cost, 0.0)
    timings["nodes"] = time.perf_counter() - started

    started = time.perf_counter()
    edges = _edge_variables(problem, free, x_offset, num_x)
    timings["edges"] = time.perf_counter() - started

    blocks_rows: list[np.ndarray] = []
    blocks_cols: list[np.ndarray] = []
    blocks_vals: list[np.ndarray] = []
    row_lower: list[np.ndarray] = []
    row_upper: list[np.ndarray] = []
    row_families: dict[str, tuple[int, int]] = {}
    next_row = 0

    def add_family(
        name: str, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, lo: np.ndarray, up: np.ndarray
    ):
        nonlocal next_row
        blocks_rows.append(rows + next_row)
        blocks_cols.append(cols)
        blocks_vals.append(vals)
        row_lower.append(lo)
        row_upper.append(up)
        row_families[name] = (next_row, next_row + len(lo))
        next_row += len(lo)

    started = time.perf_counter()
    add_family("one_hot", *_one_hot_rows(counts, free, x_offset))
    add_family("edge_out", *edges.out_rows)
    add_family("edge_in", *edges.in_rows)
    timings["rows"] = time.perf_counter() - started

    started = time.perf_counter()
    num_y = len(edges.y_cost)
    memory = _memory_rows(problem, free, x_offset, num_x + num_y, memory_times)
    if memory is not None:
        add_family(
            "memory_def", memory.def_rows, memory.def_cols, memory.def_vals, memory.def_lo, memory.def_up
        )
        add_family(
            "memory_cap", memory.cap_rows, memory.cap_cols, memory.cap_vals, memory.cap_lo, memory.cap_up
        )
    num_m = memory.num_aux if memory is not None else 0
    timings["memory"] = time.perf_counter() - started

    started = time.perf_counter()
    num_cols = num_x + num_y + num_m
    matrix = sp.csr_matrix(
        (np.concatenate(blocks_vals), (np.concatenate(blocks_rows), np.concatenate(blocks_cols))),
        shape=(next_row, num_cols),
    )
    matrix.sum_duplicates()
    timings["matrix"] = time.perf_counter() - started
    col_families = {"x": (0, num_x), "y": (num_x, num_x + num_y), "m": (num_x + num_y, num_cols)}
    memory_parts = memory.parts if memory is not None else sp.csr_matrix((0, num_cols))
    started = time.perf_counter()
    profile = memory_profile(problem, free, x_offset, num_cols)
    timings["memory_profile"] = time.perf_counter() - started
    return IntegerProgram(
        objective=np.concatenate([x_cost, edges.y_cost, np.zeros(num_m)]),
        constant=constant,
        matrix=matrix,
        row_lower=np.concatenate(row_lower),
        row_upper=np.concatenate(row_upper),
        col_lower=np.zeros(num_cols),
        col_upper=np.concatenate([x_upper, np.ones(num_y), np.full(num_m, np.inf)]),
        is_integer=np.concatenate([np.ones(num_x, bool), np.zeros(num_y + num_m, bool)]),
        x_offset=x_offset,
        strategy_counts=counts,
        row_families=row_families,
        col_families=col_families,
        y_edge=edges.y_edge,
        y_pair=edges.y_pair,
        free_edges=edges.free_edges,
        memory_parts=memory_parts,
        build_seconds=timings,
        memory_profile=profile,
    )


def _fold_constant_ends(problem: CompactProblem, free: np.ndarray) -> tuple[list[np.ndarray], float]:
    """Node costs with every edge that has a constant end folded in; the constant part of the objective."""
    node_costs = [c.copy() for c in problem.costs]
    constant = math.fsum(float(node_costs[k][0]) for k in np.flatnonzero(~free))
    for (a, b), matrix in zip(problem.edge_nodes.tolist(), problem.edge_costs, strict=True):
        if free[a] and free[b]:
            continue
        if free[a]:
            node_costs[a] += matrix[:, 0]
        elif free[b]:
            node_costs[b] += matrix[0, :]
        else:
            constant += float(matrix[0, 0])
    if not math.isfinite(constant):
        raise InfeasibleError("the strategies left to the single-strategy nodes are forbidden together")
    return node_costs, constant


@dataclass
class _EdgeVariables:
    y_cost: np.ndarray
    y_edge: np.ndarray
    y_pair: np.ndarray
    free_edges: np.ndarray
    out_rows: tuple[np.ndarray, ...]
    in_rows: tuple[np.ndarray, ...]


def _edge_variables(
    problem: CompactProblem, free: np.ndarray, x_offset: np.ndarray, y_start: int
) -> _EdgeVariables:
    """``y`` columns for the finite entries of edges between free nodes, and their marginal rows."""
    counts = problem.strategy_counts
    chosen = [e for e, (a, b) in enumerate(problem.edge_nodes.tolist()) if free[a] and free[b]]
    if not chosen:
        empty_i, empty_f = np.zeros(0, np.int64), np.zeros(0)
        rows = (empty_i, empty_i, empty_f, empty_f, empty_f)
        return _EdgeVariables(
            empty_f, empty_i, np.zeros((0, 2), np.int64), np.zeros((0, 2), np.int64), rows, rows
        )
    free_edges = problem.edge_nodes[chosen]
    a, b = free_edges[:, 0], free_edges[:, 1]
    size_a, size_b = counts[a], counts[b]
    flat = np.concatenate([problem.edge_costs[e].ravel() for e in chosen])
    entries = size_a * size_b
    edge_of = np.repeat(np.arange(len(chosen)), entries)
    local = np.arange(len(flat)) - np.repeat(np.concatenate([[0], np.cumsum(entries)[:-1]]), entries)
    finite = np.isfinite(flat)
    edge_of, local, y_cost = edge_of[finite], local[finite], flat[finite]
    i = local // size_b[edge_of]
    j = local % size_b[edge_of]
    y_cols = y_start + np.arange(len(y_cost))

    out_offset = np.concatenate([[0], np.cumsum(size_a)[:-1]])
    in_offset = np.concatenate([[0], np.cumsum(size_b)[:-1]])
    out_x_rows = np.repeat(out_offset, size_a) + concatenated_ranges(size_a)
    out_x_cols = np.repeat(x_offset[a], size_a) + concatenated_ranges(size_a)
    in_x_rows = np.repeat(in_offset, size_b) + concatenated_ranges(size_b)
    in_x_cols = np.repeat(x_offset[b], size_b) + concatenated_ranges(size_b)
    out_rows = (
        np.concatenate([out_offset[edge_of] + i, out_x_rows]),
        np.concatenate([y_cols, out_x_cols]),
        np.concatenate([np.ones(len(y_cols)), -np.ones(len(out_x_rows))]),
        np.zeros(int(size_a.sum())),
        np.zeros(int(size_a.sum())),
    )
    in_rows = (
        np.concatenate([in_offset[edge_of] + j, in_x_rows]),
        np.concatenate([y_cols, in_x_cols]),
        np.concatenate([np.ones(len(y_cols)), -np.ones(len(in_x_rows))]),
        np.zeros(int(size_b.sum())),
        np.zeros(int(size_b.sum())),
    )
    return _EdgeVariables(y_cost, edge_of, np.stack([i, j], axis=1), free_edges, out_rows, in_rows)


def _one_hot_rows(counts: np.ndarray, free: np.ndarray, x_offset: np.ndarray) -> tuple[np.ndarray, ...]:
    """``sum_s x[k, s] = 1`` for every free node."""
    free_nodes = np.flatnonzero(free)
    sizes = counts[free_nodes]
    rows = np.repeat(np.arange(len(free_nodes)), sizes)
    cols = np.repeat(x_offset[free_nodes], sizes) + concatenated_ranges(sizes)
    ones = np.ones(len(free_nodes))
    return rows, cols, np.ones(len(rows)), ones, ones


@dataclass
class _MemoryRows:
    num_aux: int
    parts: sp.csr_matrix
    def_rows: np.ndarray
    def_cols: np.ndarray
    def_vals: np.ndarray
    def_lo: np.ndarray
    def_up: np.ndarray
    cap_rows: np.ndarray
    cap_cols: np.ndarray
    cap_vals: np.ndarray
    cap_lo: np.ndarray
    cap_up: np.ndarray


def memory_row_times(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The time steps whose live set is maximal: a start at ``p_k`` followed by an end at ``p_{k+1}``."""
    points = np.unique(np.concatenate([starts, ends]))
    if len(points) < 2:
        return np.zeros(0, dtype=np.int64)
    starts_here = np.isin(points[:-1], starts)
    ends_next = np.isin(points[1:], ends)
    return points[:-1][starts_here & ends_next]


@dataclass(frozen=True)
class _MemoryLayout:
    """The memory terms that can use bytes, placed on a list of row times."""

    term_node: np.ndarray  # int64[T]
    usages: list[np.ndarray]
    usage_min: np.ndarray  # int64[T]
    usage_max: np.ndarray  # int64[T]
    first: np.ndarray  # int64[T]: first row at or after the term's start
    stop: np.ndarray  # int64[T]: first row at or after the term's end
    base: np.ndarray  # int64[R]: the usage every assignment has at each row


def _memory_layout(
    problem: CompactProblem, memory_times: np.ndarray | None
) -> tuple[np.ndarray, _MemoryLayout]:
    """(row times, layout): the maximal time steps (or ``memory_times``) and the terms placed on them."""
    usage_max = np.array([u.max() for u in problem.term_usages], dtype=np.int64)
    keep = usage_max > 0
    term_node = problem.term_node[keep]
    intervals = problem.term_intervals[keep]
    usages = [u for u, k in zip(problem.term_usages, keep.tolist(), strict=True) if k]
    times = memory_row_times(intervals[:, 0], intervals[:, 1])
    if memory_times is not None:
        times = np.unique(np.asarray(memory_times, dtype=np.int64))
    num_rows = len(times)
    first = np.searchsorted(times, intervals[:, 0], side="left")
    stop = np.searchsorted(times, intervals[:, 1], side="left")
    covers = first < stop
    usage_min = np.array([u.min() for u in usages], dtype=np.int64)
    base = np.zeros(num_rows + 1, dtype=np.int64)
    np.add.at(base, first[covers], usage_min[covers])
    np.add.at(base, stop[covers], -usage_min[covers])
    base = np.cumsum(base)[:num_rows]
    layout = _MemoryLayout(term_node, usages, usage_min, usage_max[keep], first, stop, base)
    return times, layout


def _memory_rows(
    problem: CompactProblem,
    free: np.ndarray,
    x_offset: np.ndarray,
    m_start: int,
    memory_times: np.ndarray | None = None,
) -> _MemoryRows | None:
    """Memory rows over the maximal time steps (or ``memory_times``), terms shared through a segment tree."""
    if problem.usage_limit is None or len(problem.term_node) == 0:
        return None
    if memory_times is not None and len(memory_times) == 0:
        return None
    if not any(u.max() > 0 for u in problem.term_usages):
        return None
    times, layout = _memory_layout(problem, memory_times)
    num_rows = len(times)
    term_node, usages, usage_min, first, stop = (
        layout.term_node,
        layout.usages,
        layout.usage_min,
        layout.first,
        layout.stop,
    )
    base = layout.base
    covers = first < stop

    varying = covers & free[term_node] & (layout.usage_max > usage_min)
    terms = np.flatnonzero(varying)
    size = 1 << max(1, math.ceil(math.log2(max(num_rows, 1))))
    term_of, segment_of = _segment_cover(first[terms] + size, stop[terms] + size)
    used_segments, segment_index = np.unique(segment_of, return_inverse=True)
    num_aux = len(used_segments)

    # memory_def: m[q] - sum (u - min) x = 0; each piece repeats its term's non-minimal entries
    extra = [usages[t] - usage_min[t] for t in terms.tolist()]
    sizes = np.array([len(u) for u in extra], dtype=np.int64)
    flat_extra = np.concatenate(extra) if extra else np.zeros(0, np.int64)
    flat_cols = np.repeat(x_offset[term_node[terms]], sizes) + concatenated_ranges(sizes)
    entry_start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    piece_sizes = sizes[term_of]
    entry = np.repeat(entry_start[term_of], piece_sizes) + concatenated_ranges(piece_sizes)
    part_rows = np.repeat(segment_index, piece_sizes)
    part_cols = flat_cols[entry]
    unit = memory_unit(problem.usage_limit)
    part_vals = flat_extra[entry].astype(np.float64) / unit
    nonzero = part_vals != 0
    part_rows, part_cols, part_vals = part_rows[nonzero], part_cols[nonzero], part_vals[nonzero]
    parts = sp.csr_matrix((part_vals, (part_rows, part_cols)), shape=(num_aux, m_start + num_aux))
    aux_cols = m_start + np.arange(num_aux)

    # memory_cap: sum over the ancestors of each leaf
    has_aux = np.zeros(2 * size, dtype=bool)
    has_aux[used_segments] = True
    aux_of_segment = np.full(2 * size, -1, dtype=np.int64)
    aux_of_segment[used_segments] = np.arange(num_aux)
    leaves = np.arange(num_rows) + size
    cap_rows, cap_cols = [], []
    node = leaves.copy()
    while True:
        hit = has_aux[node]
        cap_rows.append(np.flatnonzero(hit))
        cap_cols.append(m_start + aux_of_segment[node[hit]])
        if node[0] <= 1:
            break
        node >>= 1
    limit = int(problem.usage_limit)
    rows = np.concatenate(cap_rows)
    return _MemoryRows(
        num_aux=num_aux,
        parts=parts,
        def_rows=np.concatenate([np.arange(num_aux), part_rows]),
        def_cols=np.concatenate([aux_cols, part_cols]),
        def_vals=np.concatenate([np.ones(num_aux), -part_vals]),
        def_lo=np.zeros(num_aux),
        def_up=np.zeros(num_aux),
        cap_rows=rows,
        cap_cols=np.concatenate(cap_cols),
        cap_vals=np.ones(len(rows)),
        cap_lo=np.full(num_rows, -np.inf),
        cap_up=(limit - base).astype(np.float64) / unit,
    )


#: Memory rows count in units of a power of two bytes chosen so the limit is about this many units: byte
#: counts near 1e11 next to one-hot rows of ones make the LP badly scaled (HiGHS's simplex fails on them).
MEMORY_UNITS_PER_LIMIT = 2**16


def memory_unit(limit: int | None) -> float:
    """Bytes per unit in the memory rows: a power of two, so scaling is exact in floating point."""
    if not limit or limit <= MEMORY_UNITS_PER_LIMIT:
        return 1.0
    return float(2 ** (int(limit).bit_length() - 1 - MEMORY_UNITS_PER_LIMIT.bit_length() + 1))


def binding_memory_times(problem: CompactProblem) -> np.ndarray:
    """The maximal time steps where some assignment could exceed the limit.

    At every other step even the largest finite usage of every live term fits, so its ``memory_cap`` row can
    never bind and leaving it out changes nothing.
    """
    if problem.usage_limit is None or len(problem.term_node) == 0:
        return np.zeros(0, dtype=np.int64)
    largest = np.array(
        [
            int(usage[np.isfinite(problem.costs[k])].max(initial=0))
            for k, usage in zip(problem.term_node.tolist(), problem.term_usages, strict=True)
        ],
        dtype=np.int64,
    )
    return times_over(problem, largest, problem.usage_limit)


def memory_times_over(problem: CompactProblem, assignment: np.ndarray, limit: int) -> np.ndarray:
    """The maximal time steps where ``assignment`` (one strategy per super node) uses more than ``limit``."""
    if len(problem.term_node) == 0:
        return np.zeros(0, dtype=np.int64)
    chosen = np.asarray(assignment, dtype=np.int64)[problem.term_node]
    used = np.array([int(u[s]) for u, s in zip(problem.term_usages, chosen.tolist(), strict=True)], np.int64)
    return times_over(problem, used, limit)


def times_over(problem: CompactProblem, used: np.ndarray, limit: int) -> np.ndarray:
    """Maximal time steps where the terms, each using ``used``, add up to more than ``limit``."""
    starts, ends = problem.term_intervals[:, 0], problem.term_intervals[:, 1]
    times = memory_row_times(starts, ends)
    if len(times) == 0:
        return times
    delta = np.zeros(len(times) + 1, dtype=np.int64)
    np.add.at(delta, np.searchsorted(times, starts, side="left"), used)
    np.add.at(delta, np.searchsorted(times, ends, side="left"), -used)
    usage = np.cumsum(delta)[: len(times)]
    return times[usage > limit]


def _segment_cover(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canonical segment-tree nodes covering leaf ranges ``[left, right)`` (offset by the tree size)."""
    owners, segments = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    position = np.arange(len(left))
    left, right = left.copy(), right.copy()
    while len(position):
        take_left = (left & 1).astype(bool) & (left < right)
        owners.append(position[take_left])
        segments.append(left[take_left])
        left = left + take_left
        take_right = (right & 1).astype(bool) & (left < right)
        right = right - take_right
        owners.append(position[take_right])
        segments.append(right[take_right])
        left >>= 1
        right >>= 1
        active = left < right
        position, left, right = position[active], left[active], right[active]
    return np.concatenate(owners), np.concatenate(segments)


def concatenated_ranges(sizes: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s) for s in sizes])``, vectorised."""
    if len(sizes) == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return np.arange(int(sizes.sum())) - np.repeat(starts, sizes)
