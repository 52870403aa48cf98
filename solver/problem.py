"""The solver-independent problem: nodes with strategies, edges with cost matrices, memory over time.

A `Problem` is pure data (numpy arrays, no solver objects), serialisable and hashable:

- node ``i`` has ``S_i`` strategies; strategy ``s`` costs ``node_costs[i][s]`` seconds (or any unit; IOPDDL
  uses integers) and uses ``node_usages[i][s]`` bytes during the half-open interval ``intervals[i]``;
- edge ``e = (u, v)`` has an ``S_u x S_v`` cost matrix; ``inf`` marks a forbidden combination;
- ``usage_limit`` (optional) caps, at every time step, the summed usage of the nodes alive then;
- ``groups`` lists nodes that must take the same strategy index (a parameter and its gradient);
- ``pins`` fixes the strategy of some nodes.

Storage is flat for vectorised work: the strategies of node ``i`` are ``node_offsets[i]:node_offsets[i+1]``
of ``costs``/``usages``; the matrix of edge ``e`` is ``edge_offsets[e]:edge_offsets[e+1]`` of ``edge_costs``,
row-major (index ``s_u * S_v + s_v``, as in IOPDDL).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from solver.errors import ProblemError

#: Costs at or above this value are forbidden choices (the IOPDDL convention).
FORBIDDEN_COST = 1e18


INTEGRAL_CHECK_CHUNK = 1 << 16
"""Costs read at a time by :attr:`Problem.is_integral`."""


@dataclass(frozen=True, eq=False)
class Problem:
    """A whole-graph strategy selection problem (see the module docstring)."""

    node_offsets: np.ndarray  # int64[n + 1]
    costs: np.ndarray  # float64[sum S_i], inf = forbidden
    usages: np.ndarray  # int64[sum S_i], bytes
    intervals: np.ndarray  # int64[n, 2], half-open [start, end)
    edge_nodes: np.ndarray  # int64[m, 2]
    edge_offsets: np.ndarray  # int64[m + 1]
    edge_costs: np.ndarray  # float64[sum S_u * S_v], inf = forbidden
    usage_limit: int | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    pins: Mapping[int, int] = field(default_factory=dict)
    name: str = ""

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_lists(
        cls,
        costs: Sequence[Sequence[float]],
        usages: Sequence[Sequence[int]] | None = None,
        intervals: Sequence[Sequence[int]] | None = None,
        edges: Sequence[Sequence[int]] = (),
        edge_costs: Sequence[Sequence[float]] | Sequence[np.ndarray] = (),
        usage_limit: int | None = None,
        groups: Sequence[Sequence[int]] = (),
        pins: Mapping[int, int] | None = None,
        name: str = "",
    ) -> Problem:
        """Build a problem from per-node and per-edge lists; edge costs flat or as matrices."""
        n = len(costs)
        counts = np.array([len(c) for c in costs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat_costs = _flat_float([np.asarray(c, dtype=np.float64).ravel() for c in costs])
        if usages is None:
            flat_usages = np.zeros(len(flat_costs), dtype=np.int64)
        else:
            if len(usages) != n:
                raise ProblemError("nodes.usages", f"has {len(usages)} entries for {n} nodes")
            for i, (c, u) in enumerate(zip(costs, usages, strict=True)):
                if len(c) != len(u):
                    raise ProblemError(f"nodes.usages[{i}]", f"has {len(u)} entries for {len(c)} strategies")
            flat_usages = _flat_int([np.asarray(u).ravel() for u in usages], "nodes.usages")
        iv = (
            np.zeros((n, 2), dtype=np.int64)
            if intervals is None
            else _int_array(intervals, "nodes.intervals")
        )
        en = _int_array(edges, "edges.nodes").reshape(-1, 2) if len(edges) else np.zeros((0, 2), np.int64)
        mats = [np.asarray(c, dtype=np.float64).ravel() for c in edge_costs]
        if len(mats) != len(en):
            raise ProblemError("edges.costs", f"has {len(mats)} entries for {len(en)} edges")
        ecounts = np.array([len(c) for c in mats], dtype=np.int64)
        eoffsets = np.concatenate([[0], np.cumsum(ecounts)]).astype(np.int64)
        problem = cls(
            node_offsets=offsets,
            costs=flat_costs,
            usages=flat_usages,
            intervals=iv.reshape(n, 2) if n else np.zeros((0, 2), np.int64),
            edge_nodes=en,
            edge_offsets=eoffsets,
            edge_costs=_flat_float(mats),
            usage_limit=usage_limit,
            groups=tuple(tuple(int(x) for x in g) for g in groups),
            pins={int(k): int(v) for k, v in (pins or {}).items()},
            name=name,
        )
        problem.validate()
        return problem

    def replace(self, **changes: object) -> Problem:
        """A copy with some fields changed (validated)."""
        fields = {
            "node_offsets": self.node_offsets,
            "costs": self.costs,
            "usages": self.usages,
            "intervals": self.intervals,
            "edge_nodes": self.edge_nodes,
            "edge_offsets": self.edge_offsets,
            "edge_costs": self.edge_costs,
            "usage_limit": self.usage_limit,
            "groups": self.groups,
            "pins": self.pins,
            "name": self.name,
        }
        fields.update(changes)
        problem = Problem(**fields)  # type: ignore[arg-type]
        problem.validate()
        return problem

    # ----------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise `ProblemError` naming the field when the data is inconsistent."""
        n = self.num_nodes
        if self.node_offsets.ndim != 1 or self.node_offsets[0] != 0 or np.any(np.diff(self.node_offsets) < 1):
            raise ProblemError("nodes.costs", "every node needs at least one strategy")
        if len(self.costs) != self.node_offsets[-1] or len(self.usages) != len(self.costs):
            raise ProblemError("nodes.usages", "must have one entry per strategy")
        if np.isnan(self.costs).any():
            raise ProblemError(
                f"nodes.costs[{self._node_of(np.flatnonzero(np.isnan(self.costs))[0])}]", "is NaN"
            )
        if (self.costs < 0).any():
            bad = self._node_of(np.flatnonzero(self.costs < 0)[0])
            raise ProblemError(f"nodes.costs[{bad}]", "has a negative cost")
        if (self.usages < 0).any():
            bad = self._node_of(np.flatnonzero(self.usages < 0)[0])
            raise ProblemError(f"nodes.usages[{bad}]", "has a negative usage")
        if self.intervals.shape != (n, 2):
            raise ProblemError("nodes.intervals", f"must be {n} pairs [start, end)")
        if (self.intervals < 0).any():
            raise ProblemError(
                f"nodes.intervals[{int(np.argwhere(self.intervals < 0)[0, 0])}]", "is negative"
            )
        m = self.num_edges
        if self.edge_nodes.shape != (m, 2) or len(self.edge_offsets) != m + 1:
            raise ProblemError("edges.nodes", "must be pairs [u, v], one per cost matrix")
        if m:
            bad = np.flatnonzero((self.edge_nodes < 0).any(axis=1) | (self.edge_nodes >= n).any(axis=1))
            if len(bad):
                raise ProblemError(f"edges.nodes[{bad[0]}]", f"refers to a node outside 0..{n - 1}")
            loops = np.flatnonzero(self.edge_nodes[:, 0] == self.edge_nodes[:, 1])
            if len(loops):
                raise ProblemError(f"edges.nodes[{loops[0]}]", "joins a node to itself")
            counts = self.strategy_counts
            want = counts[self.edge_nodes[:, 0]] * counts[self.edge_nodes[:, 1]]
            got = np.diff(self.edge_offsets)
            wrong = np.flatnonzero(want != got)
            if len(wrong):
                e = wrong[0]
                u, v = self.edge_nodes[e]
                raise ProblemError(
                    f"edges.costs[{e}]",
                    f"has {got[e]} entries; nodes {u} and {v} have "
                    f"{counts[u]} x {counts[v]} = {want[e]} strategy pairs",
                )
        if len(self.edge_costs) != self.edge_offsets[-1]:
            raise ProblemError("edges.costs", "length does not match the edge offsets")
        if np.isnan(self.edge_costs).any():
            e = int(
                np.searchsorted(self.edge_offsets, np.flatnonzero(np.isnan(self.edge_costs))[0], "right") - 1
            )
            raise ProblemError(f"edges.costs[{e}]", "is NaN")
        if (self.edge_costs < 0).any():
            e = int(np.searchsorted(self.edge_offsets, np.flatnonzero(self.edge_costs < 0)[0], "right") - 1)
            raise ProblemError(f"edges.costs[{e}]", "has a negative cost")
        if self.usage_limit is not None and (
            not isinstance(self.usage_limit, int | np.integer) or self.usage_limit < 0
        ):
            raise ProblemError("usage_limit", "must be a non-negative integer")
        self._validate_groups_and_pins()

    def _validate_groups_and_pins(self) -> None:
        n = self.num_nodes
        counts = self.strategy_counts
        seen: dict[int, int] = {}
        for g, members in enumerate(self.groups):
            if len(members) < 1:
                raise ProblemError(f"groups[{g}]", "is empty")
            for node in members:
                if not 0 <= node < n:
                    raise ProblemError(f"groups[{g}]", f"refers to node {node} outside 0..{n - 1}")
                if node in seen:
                    raise ProblemError(f"groups[{g}]", f"node {node} is already in group {seen[node]}")
                seen[node] = g
                if counts[node] != counts[members[0]]:
                    raise ProblemError(f"groups[{g}]", "members must have the same number of strategies")
        for node, strategy in self.pins.items():
            if not 0 <= node < n:
                raise ProblemError(f"pins[{node}]", f"refers to a node outside 0..{n - 1}")
            if not 0 <= strategy < counts[node]:
                raise ProblemError(f"pins[{node}]", f"strategy {strategy} is outside 0..{counts[node] - 1}")

    def _node_of(self, flat_index: int) -> int:
        return int(np.searchsorted(self.node_offsets, flat_index, side="right") - 1)

    # ----------------------------------------------------------------- accessors
    @property
    def num_nodes(self) -> int:
        return len(self.node_offsets) - 1

    @property
    def num_edges(self) -> int:
        return len(self.edge_nodes)

    @cached_property
    def strategy_counts(self) -> np.ndarray:
        return np.diff(self.node_offsets)

    @cached_property
    def strategy_node(self) -> np.ndarray:
        """For each flat strategy entry, the node it belongs to."""
        return np.repeat(np.arange(self.num_nodes), self.strategy_counts)

    def node_costs(self, i: int) -> np.ndarray:
        return self.costs[self.node_offsets[i] : self.node_offsets[i + 1]]

    def node_usages(self, i: int) -> np.ndarray:
        return self.usages[self.node_offsets[i] : self.node_offsets[i + 1]]

    def edge_matrix(self, e: int) -> np.ndarray:
        u, v = self.edge_nodes[e]
        counts = self.strategy_counts
        return self.edge_costs[self.edge_offsets[e] : self.edge_offsets[e + 1]].reshape(counts[u], counts[v])

    @cached_property
    def is_integral(self) -> bool:
        """True when every finite cost is an integer (IOPDDL problems are). Read a slice at a time, so a
        problem of costs in seconds (tens of millions of edge costs) is answered at its first fraction."""
        for costs in (self.costs, self.edge_costs):
            for start in range(0, len(costs), INTEGRAL_CHECK_CHUNK):
                chunk = costs[start : start + INTEGRAL_CHECK_CHUNK]
                finite = chunk[np.isfinite(chunk)]
                if not np.all(finite == np.round(finite)):
                    return False
        return True

    # ----------------------------------------------------------------- identity
    @cached_property
    def content_hash(self) -> str:
        """A canonical sha256 of everything that defines the optimum (not the name)."""
        digest = hashlib.sha256(b"autoshard-problem-v1")
        for array in (
            self.node_offsets.astype("<i8"),
            self.costs.astype("<f8"),
            self.usages.astype("<i8"),
            self.intervals.astype("<i8"),
            self.edge_nodes.astype("<i8"),
            self.edge_offsets.astype("<i8"),
            self.edge_costs.astype("<f8"),
        ):
            digest.update(np.int64(array.size).tobytes())
            digest.update(np.ascontiguousarray(array).tobytes())
        digest.update(repr(self.usage_limit).encode())
        digest.update(repr(sorted(tuple(sorted(g)) for g in self.groups)).encode())
        digest.update(repr(sorted(self.pins.items())).encode())
        return digest.hexdigest()

    def summary(self) -> str:
        return (
            f"{self.name or 'problem'}: {self.num_nodes} nodes, {self.num_edges} edges, "
            f"{int(self.node_offsets[-1])} strategies, limit {self.usage_limit}"
        )


def _flat_float(parts: list[np.ndarray]) -> np.ndarray:
    flat = _laid_end_to_end(parts)
    if flat is None:
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)
        flat = flat.astype(np.float64, copy=False)  # concatenate made a new array: no second copy
    flat[flat >= FORBIDDEN_COST] = math.inf
    return flat


def _laid_end_to_end(parts: list[np.ndarray]) -> np.ndarray | None:
    """The one float64 array ``parts`` are, when they are views lying end to end in it (a plan's builder
    writes its edge matrices so: on a 3-D mesh 40 million costs, which a concatenation would copy); else
    None."""
    if not parts or not isinstance(parts[0].base, np.ndarray):
        return None
    base = parts[0].base
    if base.dtype != np.float64 or base.ndim != 1 or not base.flags.c_contiguous:
        return None
    start = address = parts[0].__array_interface__["data"][0]
    for part in parts:
        contiguous = part.base is base and part.dtype == np.float64 and part.flags.c_contiguous
        if not contiguous or part.__array_interface__["data"][0] != address:
            return None
        address += part.nbytes
    first = (start - base.__array_interface__["data"][0]) // base.itemsize
    return base[first : first + (address - start) // base.itemsize]


def _flat_int(parts: list[np.ndarray], field_name: str) -> np.ndarray:
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if flat.dtype.kind == "f":
        if not np.all(np.isfinite(flat)) or np.any(flat != np.round(flat)):
            raise ProblemError(field_name, "must hold integers (bytes)")
    elif flat.dtype.kind not in "iu" and flat.size:
        raise ProblemError(field_name, "must hold integers (bytes)")
    return flat.astype(np.int64)


def _int_array(values: object, field_name: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except ValueError as exc:
        raise ProblemError(field_name, "must be a list of integer pairs") from exc
    if array.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 2 or array.dtype.kind not in "iu":
        raise ProblemError(field_name, "must be a list of integer pairs")
    return array.astype(np.int64)
