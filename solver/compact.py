"""The compact form the heuristics and integer programs work on: groups folded into super nodes.

A `CompactProblem` has one *super node* per group of the `Problem` (an ungrouped node is a group of one):

- ``costs[k]``: the summed node costs of the members, plus the diagonal of every edge inside the group
  (members share one strategy index), ``inf`` for strategies excluded by a pin;
- ``edges``: one matrix per unordered pair of super nodes, parallel and member edges summed, oriented
  ``(a, b)`` with ``a < b``;
- memory *terms*: one per member node with a non-empty interval: ``(super node, [start, end), usage[s])``.

`lift` turns a super-node assignment back into one strategy index per original node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from solver.problem import Problem


@dataclass(frozen=True, eq=False)
class CompactProblem:
    """Super nodes, summed edges and memory terms (see the module docstring)."""

    costs: list[np.ndarray]  # per super node, float64[S_k]
    edge_nodes: np.ndarray  # int64[m, 2], a < b
    edge_costs: list[np.ndarray]  # per edge, float64[S_a, S_b]
    term_node: np.ndarray  # int64[T]: the super node of each memory term
    term_intervals: np.ndarray  # int64[T, 2]
    term_usages: list[np.ndarray]  # per term, int64[S_k]
    usage_limit: int | None
    node_of: np.ndarray  # int64[n_original]: the super node of each original node

    @property
    def num_nodes(self) -> int:
        return len(self.costs)

    @property
    def num_edges(self) -> int:
        return len(self.edge_nodes)

    @cached_property
    def strategy_counts(self) -> np.ndarray:
        return np.array([len(c) for c in self.costs], dtype=np.int64)

    @cached_property
    def incident_edges(self) -> list[list[int]]:
        """For each super node, the indices of the edges that touch it."""
        incident: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for e, (a, b) in enumerate(self.edge_nodes.tolist()):
            incident[a].append(e)
            incident[b].append(e)
        return incident

    @cached_property
    def node_terms(self) -> list[list[int]]:
        """For each super node, the indices of its memory terms."""
        terms: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for t, k in enumerate(self.term_node.tolist()):
            terms[k].append(t)
        return terms

    def lift(self, super_solution: np.ndarray) -> np.ndarray:
        """One strategy index per original node."""
        return np.asarray(super_solution, dtype=np.int64)[self.node_of]

    def cost(self, super_solution: np.ndarray) -> float:
        """Objective of a super-node assignment (``inf`` when forbidden)."""
        chosen = np.asarray(super_solution, dtype=np.int64)
        total = math.fsum(c[s] for c, s in zip(self.costs, chosen.tolist(), strict=True))
        for (a, b), matrix in zip(self.edge_nodes.tolist(), self.edge_costs, strict=True):
            total += matrix[chosen[a], chosen[b]]
        return float(total)

    def trivial_bound(self) -> float:
        """A valid lower bound: every node and every edge at its own cheapest finite entry."""
        nodes = math.fsum(float(np.min(c)) for c in self.costs)
        edges = math.fsum(float(np.min(m)) for m in self.edge_costs)
        return nodes + edges


def compact(problem: Problem) -> CompactProblem:
    """Fold the groups and pins of `problem` into super nodes."""
    n = problem.num_nodes
    node_of = np.arange(n, dtype=np.int64)
    for members in problem.groups:
        node_of[list(members)] = members[0]
    representatives, node_of = np.unique(node_of, return_inverse=True)
    node_of = node_of.astype(np.int64)
    counts = problem.strategy_counts[representatives]
    costs = [np.zeros(int(c)) for c in counts]
    for i in range(n):
        costs[node_of[i]] = costs[node_of[i]] + problem.node_costs(i)
    for node, strategy in problem.pins.items():
        pinned = np.full(len(costs[node_of[node]]), math.inf)
        pinned[strategy] = 0.0
        costs[node_of[node]] = costs[node_of[node]] + pinned

    pair_matrices: dict[tuple[int, int], np.ndarray] = {}
    for e in range(problem.num_edges):
        u, v = problem.edge_nodes[e]
        a, b = int(node_of[u]), int(node_of[v])
        matrix = problem.edge_matrix(e)
        if a == b:
            costs[a] = costs[a] + np.diagonal(matrix)
            continue
        if a > b:
            a, b, matrix = b, a, matrix.T
        previous = pair_matrices.get((a, b))
        pair_matrices[(a, b)] = matrix.copy() if previous is None else previous + matrix
    keys = sorted(pair_matrices)
    edge_nodes = np.array(keys, dtype=np.int64).reshape(-1, 2)
    edge_costs = [pair_matrices[key] for key in keys]

    alive = np.flatnonzero(problem.intervals[:, 1] > problem.intervals[:, 0])
    return CompactProblem(
        costs=costs,
        edge_nodes=edge_nodes,
        edge_costs=edge_costs,
        term_node=node_of[alive],
        term_intervals=problem.intervals[alive],
        term_usages=[problem.node_usages(int(i)) for i in alive],
        usage_limit=problem.usage_limit,
        node_of=node_of,
    )
