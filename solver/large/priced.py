"""The strategies memory prices make promising, and the search over them.

Where memory binds hard, the optimum takes strategies the memory-free optimum never would, and a program of
all of them (IOPDDL V: 784,000 columns) is too large to search well. The Lagrangian relaxation of the memory
rows says which ones matter: at prices ``mu`` on the memory rows, each node's strategies ranked by cost plus
``mu`` times usage. Promising are the strategies of every assignment decoded at the prices tried and each
node's best beliefs at the best prices, of two searches over ``mu``: the subgradient ascent of
`solver.bounds.memory_priced` (passed in as ``also``) and the root of `solver.bounds.lagrangian_branch`
(Kelley's cutting planes over TRW-S), plus the incumbent's (so the incumbent stays an answer). The program
over them is a few percent of the size (V: ~1,850 of 11,280 strategies, 18,000-40,000 columns):
`solver.priced_phases.priced_phase` solves it whole where it is small enough, else `search_restricted`
searches it region by region around the peak. Its answer is an answer of the whole problem; the search then
goes on over every strategy from there.

Measured on V (60 s limit, 2 cores; the heuristic's 3.1M first): with the cutting planes' strategies alone
(they stay at ``mu = 0`` on V) the program's optimum is 2.11M; with the ascent's too, 1.74-1.76M (optimal in
15-17 s), and the search over all strategies then reaches 1.617M, the contest winner's cost.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from solver.bounds.lagrangian_branch import LagrangianBranch
from solver.compact import CompactProblem
from solver.large.peak import peak_lns
from solver.large.pruned import from_restricted, restrict, to_restricted
from solver.large.regions import RegionSearch


def promising_strategies(
    problem: CompactProblem, incumbent: np.ndarray, deadline: float, also: list[np.ndarray] | None = None
) -> tuple[list[np.ndarray] | None, np.ndarray | None]:
    """(per node, the sorted strategies the root of the Lagrangian search marks promising, with ``also``'s
    (per node, more strategies: those the subgradient ascent of `solver.bounds.memory_priced` marks), the
    ``incumbent``'s and the best decoded answer's; that answer, None if none fits). (None, None) where the
    search does not apply (no edge, no memory limit) or ran out of time before its root's beliefs."""
    try:
        search = LagrangianBranch(problem)
    except ValueError:
        return None, None
    searched = search.run(0.0, deadline, incumbent=incumbent, give_up_gap=0.0)  # the root only
    keep = search.promising_strategies()
    if any(len(kept) == 0 for kept in keep):
        return None, None
    if also is not None:
        keep = [np.union1d(kept, more) for kept, more in zip(keep, also, strict=True)]
    answers = [np.asarray(incumbent, dtype=np.int64)]
    if searched.assignment is not None:
        answers.append(searched.assignment)
    keep = [np.union1d(kept, [int(a[k]) for a in answers]).astype(np.int64) for k, kept in enumerate(keep)]
    return keep, searched.assignment


def search_restricted(
    problem: CompactProblem,
    keep: list[np.ndarray],
    start: np.ndarray,
    deadline: float,
    search: RegionSearch,
) -> np.ndarray:
    """`peak_lns` on ``problem`` restricted to ``keep`` (which holds ``start``'s strategies) until
    ``deadline``, as ``search`` says (its incumbents told in ``problem``'s strategy indices); its answer in
    ``problem``'s strategy indices (never worse than ``start``)."""
    on_incumbent = search.on_incumbent
    restricted = restrict(problem, keep)
    local = to_restricted(keep, start)
    assert local is not None, "keep holds the start's strategies"

    def report(cost: float, answer: np.ndarray) -> None:
        if on_incumbent is not None:
            on_incumbent(cost, from_restricted(keep, answer))

    answer, _stats = peak_lns(restricted, local, deadline, dataclasses.replace(search, on_incumbent=report))
    return from_restricted(keep, answer)


__all__ = ["promising_strategies", "search_restricted"]
