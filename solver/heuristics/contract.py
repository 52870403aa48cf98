"""Contract functional edges before the search: nodes whose strategy another node's strategy forces.

An edge ``(a, b)`` is *functional* from ``a`` when every allowed strategy of ``a`` has at most one
allowed strategy of ``b`` at finite edge cost: in every finite solution ``s_b = phi(s_a)``. Then ``b`` (with
everything already merged into it) joins ``a``'s cluster: a cluster is one node whose strategies are
those of its root, and member ``x`` takes ``maps[x][s]`` when the cluster takes ``s``. Strategies that
lead to a forbidden cost inside a cluster are dropped. Most IOPDDL edges are functional (resharding
that must not happen), so the contracted problem is several times smaller, and, more to the point, a
move on one cluster moves the whole chain of nodes that must agree with it. The contraction is exact:
finite solutions of both problems correspond one to one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.compact import CompactProblem


@dataclass(frozen=True)
class Contraction:
    """The contracted problem and the way back to the original super nodes."""

    problem: CompactProblem
    cluster: np.ndarray  # per original node: its contracted node
    maps: list[np.ndarray]  # per original node: contracted strategy -> own strategy

    def expand(self, assign: np.ndarray) -> np.ndarray:
        """The original assignment of a contracted one."""
        pairs = zip(self.maps, self.cluster.tolist(), strict=True)
        return np.array([m[assign[k]] for m, k in pairs], dtype=np.int64)

    def restrict(self, original: np.ndarray) -> np.ndarray | None:
        """The contracted assignment that expands to ``original``, or None when there is none."""
        candidates = [np.ones(len(c), dtype=bool) for c in self.problem.costs]
        for x, k in enumerate(self.cluster.tolist()):
            candidates[k] &= self.maps[x] == original[x]
        assign = np.zeros(self.problem.num_nodes, dtype=np.int64)
        for k, ok in enumerate(candidates):
            if not ok.any():
                return None
            assign[k] = int(np.argmax(ok))
        return assign


def contract(problem: CompactProblem) -> Contraction | None:
    """Contract every functional edge (repeatedly); None when some node has no allowed strategy left."""
    merger = _Merger(problem)
    if not merger.run():
        return None
    return merger.build()


class _Merger:
    """Union-find of nodes along functional edges; ``maps[x]`` sends the parent's strategies to ``x``'s."""

    def __init__(self, problem: CompactProblem):
        self.problem = problem
        n = problem.num_nodes
        self.parent = np.arange(n)
        self.maps = [np.arange(len(c)) for c in problem.costs]
        self.allowed = [np.isfinite(c) for c in problem.costs]
        self.version = np.zeros(n, dtype=np.int64)

    def find(self, x: int) -> int:
        """The cluster root of ``x``; compresses the path, composing the maps on the way."""
        path = []
        while self.parent[x] != x:
            path.append(x)
            x = int(self.parent[x])
        for y in reversed(path):
            above = int(self.parent[y])
            if above != x:
                self.maps[y] = self.maps[y][self.maps[above]]
                self.parent[y] = x
        return x

    def run(self) -> bool:
        """Merge until nothing changes; False when a cluster loses every strategy.

        An edge is looked at again only when one of its clusters changed since it was last passed over.
        """
        m = self.problem.num_edges
        seen = np.full((m, 4), -1, dtype=np.int64)
        changed = True
        while changed:
            changed = False
            for e, (a, b) in enumerate(self.problem.edge_nodes.tolist()):
                ra, rb = self.find(a), self.find(b)
                key = (ra, rb, self.version[ra], self.version[rb])
                if tuple(seen[e].tolist()) == key:
                    continue
                if self._visit(e, a, b, ra, rb):
                    changed = True
                    if not self.allowed[self.find(a)].any():
                        return False
                else:
                    seen[e] = key
        return True

    def _visit(self, e: int, a: int, b: int, ra: int, rb: int) -> bool:
        matrix = self.problem.edge_costs[e]
        if ra != a or rb != b:
            matrix = matrix[self.maps[a]][:, self.maps[b]]
        if ra == rb:
            keep = self.allowed[ra] & np.isfinite(np.diagonal(matrix))
            if np.array_equal(keep, self.allowed[ra]):
                return False
            self.allowed[ra] = keep
            self.version[ra] += 1
            return True
        finite = np.isfinite(matrix) & self.allowed[ra][:, None] & self.allowed[rb][None, :]
        if np.count_nonzero(finite, axis=1).max(initial=0) <= 1:
            self._merge(ra, rb, finite)
            return True
        if np.count_nonzero(finite, axis=0).max(initial=0) <= 1:
            self._merge(rb, ra, finite.T)
            return True
        return False

    def _merge(self, keep: int, gone: int, finite: np.ndarray) -> None:
        """Fold cluster ``gone`` into ``keep``: ``finite[s_keep, s_gone]`` has at most one True per row."""
        self.allowed[keep] = self.allowed[keep] & finite.any(axis=1)
        self.maps[gone] = np.argmax(finite, axis=1)
        self.parent[gone] = keep
        self.version[keep] += 1

    def build(self) -> Contraction:
        """The contracted `CompactProblem` over allowed strategies only."""
        p = self.problem
        n = len(self.parent)
        root = np.array([self.find(x) for x in range(n)], dtype=np.int64)
        roots = np.unique(root)
        index = np.full(n, -1, dtype=np.int64)
        index[roots] = np.arange(len(roots))
        keep = {int(r): np.flatnonzero(self.allowed[r]) for r in roots.tolist()}
        maps = [self.maps[x][keep[int(root[x])]] for x in range(n)]
        cluster = index[root]
        costs = [np.zeros(len(keep[int(r)])) for r in roots.tolist()]
        for x in range(n):
            costs[cluster[x]] += p.costs[x][maps[x]]
        pairs: dict[tuple[int, int], np.ndarray] = {}
        for e, (a, b) in enumerate(p.edge_nodes.tolist()):
            ka, kb = int(cluster[a]), int(cluster[b])
            if ka == kb:
                costs[ka] += p.edge_costs[e][maps[a], maps[b]]
                continue
            matrix = p.edge_costs[e][np.ix_(maps[a], maps[b])]
            if ka > kb:
                ka, kb, matrix = kb, ka, matrix.T
            previous = pairs.get((ka, kb))
            pairs[(ka, kb)] = matrix if previous is None else previous + matrix
        keys = sorted(pairs)
        term_node = p.term_node.astype(np.int64)
        contracted = CompactProblem(
            costs=costs,
            edge_nodes=np.array(keys, dtype=np.int64).reshape(-1, 2),
            edge_costs=[pairs[key] for key in keys],
            term_node=cluster[term_node],
            term_intervals=p.term_intervals,
            term_usages=[u[maps[x]] for u, x in zip(p.term_usages, term_node.tolist(), strict=True)],
            usage_limit=p.usage_limit,
            node_of=np.arange(len(roots), dtype=np.int64),
        )
        return Contraction(problem=contracted, cluster=cluster, maps=maps)
