"""Large neighbourhood search where the memory limit binds: regions around the peak, solved exactly.

On a memory-tight problem a cheaper answer must move memory: a node that takes a dearer, smaller strategy at
a step where the limit binds pays for another one live at the same step that takes a cheaper, larger one.
Regions grown along the graph from a random root (`solver.large.lns`) rarely hold both, so the search stalls
on these problems. Here each round (`solver.large.regions`) picks a region and solves the program of the
whole problem with every node outside it fixed at the incumbent (`solver.large.regions.fixed_outside`: the
fixed nodes' edges become node costs, their memory a constant profile), memory rows and all, with the
backend, warm-started from the incumbent:

- *peak* regions (half of the rounds): a memory row ``r`` drawn with the rows of least slack
  ``limit - usage_r`` most likely (rank ``floor(R u^3)`` of the rows sorted by slack, ``u`` uniform), the
  free nodes with a term live at ``r`` whose usage depends on their strategy in random order, then their
  neighbours breadth-first;
- *graph* regions (the other half): breadth-first from a random free node, as `solver.large.lns`.

A region grows until its program would have `region_columns` columns (``x`` plus the finite ``y`` of the
edges inside it), so nodes with 128 strategies make small regions and nodes with 4 large ones. The budget
adapts to the instance: it grows by `GROW` after a region solved to optimality in under `QUICK_SHARE` of its
time and shrinks by `SHRINK` after one that ran out of time. An answer is taken when it is strictly cheaper
and fits the limit (checked on the whole problem), so the result is never worse than the incumbent and
always feasible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.backends.base import OPTIMAL, BackendResult
from solver.compact import CompactProblem
from solver.ilp import IntegerProgram, binding_memory_times, build_program
from solver.large.regions import RegionPicker, RegionSearch, search_regions

#: Columns of a region's program at first, and the range the adaptation keeps it in.
REGION_COLUMNS = 20_000
MIN_COLUMNS, MAX_COLUMNS = 2_000, 200_000
#: The backend's time per region.
REGION_SECONDS = 5.0
#: Budget adaptation: grow after a region proven optimal within this share of its time, shrink after one
#: that ran out of time.
QUICK_SHARE = 0.25
GROW, SHRINK = 1.25, 0.7
#: Share of the regions seeded at a memory row (the rest grow from a random node).
PEAK_SHARE = 0.5


@dataclass(frozen=True)
class PeakStats:
    """What the search did: regions tried, improved (peak regions among them), its last column budget and
    the cost it reached."""

    regions: int
    improved: int
    peak_improved: int
    region_columns: int
    cost: float


@dataclass(frozen=True)
class PeakSettings:
    """How the search around the peak sizes its regions, and when it ends before its deadline: once its cost
    is proven within ``relative_gap`` of ``bound`` (a lower bound of the whole program), or after
    ``patience`` regions in a row that improved nothing."""

    region_columns: int = REGION_COLUMNS
    """The first regions' column budget (it adapts)."""
    max_columns: int = MAX_COLUMNS
    """The most it grows to."""
    bound: float = -math.inf
    relative_gap: float = 0.0
    patience: int | None = None


def peak_lns(
    problem: CompactProblem,
    incumbent: np.ndarray,
    deadline: float,
    search: RegionSearch | None = None,
    settings: PeakSettings | None = None,
) -> tuple[np.ndarray, PeakStats]:
    """Improve ``incumbent`` (feasible) region by region until ``deadline``, a `time.perf_counter()` value,
    or until ``settings`` say it ends, as ``search`` says (None: the defaults of `RegionSearch` and
    `PeakSettings`)."""
    search, settings = search or RegionSearch(), settings or PeakSettings()
    rng = np.random.default_rng(search.seed)
    picker = _PeakRegions(_Layout(problem), rng, float(settings.region_columns), settings)
    searched = search_regions(picker, incumbent, deadline, search)
    stats = PeakStats(
        searched.regions, searched.improved, picker.peak_improved, int(picker.budget), searched.cost
    )
    return searched.assignment, stats


class _PeakRegions(RegionPicker):
    """Regions seeded at a memory row of least slack (`PEAK_SHARE` of them) or at a random free node, grown
    to a column ``budget`` that adapts (`GROW`, `SHRINK`), until ``until`` says it ends."""

    reserve, margin = 0.1, 0.25

    def __init__(self, layout: _Layout, rng: np.random.Generator, budget: float, until: PeakSettings) -> None:
        self.problem = layout.problem
        self.layout = layout
        self.rng = rng
        self.budget = budget
        self.max_columns = until.max_columns
        self.seconds = REGION_SECONDS
        self.at_peak = False  # whether the last region was seeded at a memory row
        self.until = until
        self.peak_improved = self.since = 0  # answers taken from peak regions; regions since the last one

    def goes_on(self, cost: float) -> bool:
        until = self.until
        unproven = cost - until.bound > until.relative_gap * abs(cost)
        return unproven and (until.patience is None or self.since < until.patience)

    def pick(self, current: np.ndarray) -> np.ndarray:
        layout, rng = self.layout, self.rng
        self.at_peak = layout.num_rows > 0 and rng.random() < PEAK_SHARE
        seeds = layout.peak_seeds(current, rng) if self.at_peak else np.array([rng.choice(layout.free)])
        return layout.grow(seeds, int(self.budget), rng)

    def program(self, sub: CompactProblem) -> IntegerProgram:
        return build_program(sub, memory_times=binding_memory_times(sub))

    def solved(self, region: np.ndarray, result: BackendResult, limit: float, adopted: bool) -> bool:
        if result.status == OPTIMAL and result.seconds < QUICK_SHARE * limit:
            self.budget = min(self.max_columns, self.budget * GROW)
        elif result.status != OPTIMAL:
            self.budget = max(min(MIN_COLUMNS, self.budget), self.budget * SHRINK)
        self.since = 0 if adopted else self.since + 1
        self.peak_improved += int(adopted and self.at_peak)
        return False


class _Layout:
    """The problem's memory rows, which terms cover which, and each edge's column count, built once."""

    def __init__(self, problem: CompactProblem) -> None:
        self.problem = problem
        counts = problem.strategy_counts
        self.free = np.flatnonzero(counts > 1)
        self.is_free = counts > 1
        self.edge_columns = np.array([int(np.isfinite(m).sum()) for m in problem.edge_costs], dtype=np.int64)
        starts, ends = problem.term_intervals[:, 0], problem.term_intervals[:, 1]
        self.times = binding_memory_times(problem)  # none without a limit
        self.num_rows = len(self.times)
        self.first = np.searchsorted(self.times, starts, side="left")
        self.stop = np.searchsorted(self.times, ends, side="left")
        varies = np.array([int(u.max()) > int(u.min()) for u in problem.term_usages], dtype=bool)
        self.movable = varies & self.is_free[problem.term_node] if len(varies) else varies

    def row_usage(self, assignment: np.ndarray) -> np.ndarray:
        """Usage of ``assignment`` at each binding row."""
        p = self.problem
        chosen = assignment[p.term_node]
        used = np.array([int(u[s]) for u, s in zip(p.term_usages, chosen.tolist(), strict=True)], np.int64)
        delta = np.zeros(self.num_rows + 1, dtype=np.int64)
        np.add.at(delta, self.first, used)
        np.add.at(delta, self.stop, -used)
        return np.cumsum(delta)[: self.num_rows]

    def peak_seeds(self, assignment: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The free nodes with a movable term live at a row drawn towards the least slack, shuffled."""
        usage = self.row_usage(assignment)
        order = np.argsort(usage)[::-1]  # least slack first
        row = int(order[int(len(order) * rng.random() ** 3)])
        live = (self.first <= row) & (row < self.stop) & self.movable
        nodes = np.unique(self.problem.term_node[live])
        if len(nodes) == 0:
            return np.array([rng.choice(self.free)])
        return rng.permutation(nodes)

    def grow(self, seeds: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        """The seeds in order, then their free neighbours breadth-first (shuffled per node), while the
        region's program stays within ``budget`` columns; at least one node."""
        p = self.problem
        counts = p.strategy_counts
        inside = np.zeros(p.num_nodes, dtype=bool)
        order: list[int] = []
        columns = 0

        def add(node: int) -> bool:
            nonlocal columns
            extra = int(counts[node])
            for e in p.incident_edges[node]:
                a, b = p.edge_nodes[e]
                other = int(b if a == node else a)
                if inside[other]:
                    extra += int(self.edge_columns[e])
            if order and columns + extra > budget:
                return False
            inside[node] = True
            order.append(node)
            columns += extra
            return True

        for node in seeds.tolist():
            if not inside[node] and self.is_free[node]:
                add(int(node))
        head = 0
        while head < len(order) and columns < budget:
            node = order[head]
            head += 1
            neighbours = []
            for e in p.incident_edges[node]:
                a, b = p.edge_nodes[e]
                other = int(b if a == node else a)
                if self.is_free[other] and not inside[other]:
                    neighbours.append(other)
            for other in rng.permutation(np.array(neighbours, dtype=np.int64)).tolist():
                if not inside[other]:
                    add(int(other))
        return np.array(sorted(order), dtype=np.int64)


__all__ = ["PeakStats", "peak_lns"]
