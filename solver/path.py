"""Which path a solve takes: the backend, the mode, and the phases its size and memory limit call for.

`choose_path` decides once, from the compacted problem alone, before any phase runs; the phases
(`solver.phases`, `solver.priced_phases`) read the `SolvePath` rather than testing the problem again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from solver import policy
from solver.compact import CompactProblem
from solver.ilp import binding_memory_times


class Mode(str, enum.Enum):
    """How the work after the heuristic is done."""

    FULL = "full"
    """The whole program goes to a backend."""
    HEURISTIC = "heuristic"
    """The heuristic alone (backend ``heuristic``)."""
    LNS = "lns"
    """Too large for a backend: the heuristic, then region-by-region search with the backend."""


@dataclass(frozen=True)
class SolvePath:
    """The path `choose_path` chose."""

    backend: str
    """The backend that solves the programs (``heuristic``: none)."""
    mode: Mode
    tight: bool
    """The memory limit binds somewhere: some step some assignment could overflow."""
    search_first: bool
    """The Lagrangian search runs first: a memory limit and a gap to meet."""
    priced_first: bool
    """Tight and too large for the whole program: the memory-priced bound and program, then the peak
    search."""
    whole: bool
    """The whole program goes to the backend (its first work begun before the heuristic)."""
    pruned: bool
    """Few enough nodes with a choice for the pruned solve (`use_pruned`)."""
    priced_lns: bool
    """Too large for the whole program, tight, many nodes: the memory prices before the region search."""
    columns: int
    """The whole program's columns before memory auxiliaries (`program_shape`; 0 for the heuristic alone)."""
    rows: int
    """... and its rows before memory rows."""

    @property
    def label(self) -> str:
        """The backend as `SolveResult.backend` names it."""
        return self.backend if self.mode != Mode.LNS else f"{self.backend} (lns)"


def choose_path(core: CompactProblem, backend: str, relative_gap: float) -> SolvePath:
    """The whole program for a backend when it is small enough, else the heuristic (on every core) followed by
    large neighbourhood search with the backend (``auto``: HiGHS, measured best on both); ``heuristic``: the
    heuristic alone."""
    if backend == Mode.HEURISTIC.value:
        chosen, mode, (columns, rows) = Mode.HEURISTIC.value, Mode.HEURISTIC, (0, 0)
    else:
        columns, rows = program_shape(core)
        chosen = "highs" if backend == "auto" else backend
        mode = Mode.FULL if columns <= policy.FULL_PROGRAM_MAX_VARIABLES else Mode.LNS
    tight = mode != Mode.HEURISTIC and len(binding_memory_times(core)) > 0
    priced_first = mode == Mode.FULL and tight and columns > policy.PEAK_WHOLE_MAX_COLUMNS
    pruned = use_pruned(core)
    return SolvePath(
        backend=chosen,
        mode=mode,
        tight=tight,
        search_first=mode != Mode.HEURISTIC and core.usage_limit is not None and relative_gap > 0,
        priced_first=priced_first,
        whole=mode == Mode.FULL and not priced_first,
        pruned=pruned,
        # Too large for the whole program and tight: the heuristic stops once stale (it goes on from its best
        # answer on another core) and the memory prices decide what comes next.
        priced_lns=mode == Mode.LNS and tight and not pruned,
        columns=columns,
        rows=rows,
    )


def use_pruned(core: CompactProblem) -> bool:
    """The pruned solve suits few nodes with many strategies each (plans on 3-D meshes); with thousands of
    nodes (the IOPDDL instances) its restricted program is itself too large, and the time goes to LNS."""
    return int((core.strategy_counts > 1).sum()) <= policy.PRUNED_MAX_NODES


def heuristic_share(core: CompactProblem, path: SolvePath) -> float:
    """The share of the time limit the heuristic gets before a backend takes over."""
    if path.mode == Mode.HEURISTIC:
        return 1.0
    if path.mode == Mode.LNS:
        return 0.1 if path.pruned else 0.5
    size = int(core.strategy_counts.sum())
    if size <= 2_000:
        return 0.02
    if size <= 50_000:
        return 0.1
    return 0.3


def program_size(core: CompactProblem) -> int:
    """Columns the integer program of `core` will have, before memory auxiliaries (x plus finite y)."""
    return program_shape(core)[0]


def program_shape(core: CompactProblem) -> tuple[int, int]:
    """(columns, rows) of the integer program of `core` before memory rows: x plus finite y; one-hot rows plus
    both marginal families of every edge between nodes with a choice."""
    free = core.strategy_counts > 1
    counts = core.strategy_counts
    columns, rows = int(counts[free].sum()), int(free.sum())
    for (a, b), m in zip(core.edge_nodes.tolist(), core.edge_costs, strict=True):
        if free[a] and free[b]:
            columns += int(np.isfinite(m).sum())
            rows += int(counts[a] + counts[b])
    return columns, rows
