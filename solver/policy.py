"""The solve's tuning constants: sizes that pick a path, shares of the time limit each phase may take.

One line each on what it trades. The measurements that chose them (instances, seconds, costs) are in
benchmarks/README.md, "Solver policy: what chose each constant". The pipeline reads them as ``policy.NAME``
when it runs, so a test may set one for a solve (``monkeypatch.setattr(policy, ...)``).
"""

from __future__ import annotations

from solver.large.peak import MAX_COLUMNS as PEAK_MAX_COLUMNS

# Which path a problem takes (`solver.path`).

#: Largest program sent whole to a backend: more solves larger problems exactly, less keeps them in time.
FULL_PROGRAM_MAX_VARIABLES = 1_500_000
#: Most nodes with a choice for the pruned solve: more gives it larger ones, whose pruned program outgrows it.
PRUNED_MAX_NODES = 2_000
#: Most columns for column generation: more grows it on larger programs, each round's TRW-S pricing slower.
GENERATION_MAX_COLUMNS = 1_000_000
#: Most columns for the whole program where memory binds: more tries whole programs a backend may not finish.
PEAK_WHOLE_MAX_COLUMNS = PEAK_MAX_COLUMNS
#: Most columns for the promising strategies' program whole: more solves it exactly, slower than by regions.
PRICED_WHOLE_MAX_COLUMNS = PEAK_MAX_COLUMNS
#: Memory's price share of the root's bound that makes the search stop there: lower skips branching sooner.
TIGHT_PRICE_SHARE = 0.1

# How the time is shared.

#: Least share of the limit left to the phases after the reductions: more overruns, less leaves no answer.
MIN_LEFT_SHARE = 0.25
#: Share of the time left kept for mapping back and re-costing: more is safer, less leaves more for search.
FINISH_RESERVE = 0.02
#: Share of the time left kept for the Lagrangian bound: more proves more, less leaves time for search.
BOUND_SHARE = 0.2
#: Share of the time left for the Lagrangian search first: more proves more, less leaves time for search.
LAGRANGIAN_SHARE = 0.1
#: ... but at least this many seconds: more lets its root finish under short limits, less leaves more.
LAGRANGIAN_MIN_S = 1.0
#: ... or this share of the time left when that is less: more for the search, less for what follows.
LAGRANGIAN_MIN_SHARE = 0.34
#: Gap at its root past which the Lagrangian search gives up: more keeps branching where TRW-S is loose.
LAGRANGIAN_GIVE_UP_GAP = 0.05
#: Share of the gap asked for that the promising strategies' program is solved to: less is better, slower.
RESTRICTED_GAP_SHARE = 0.25
#: Share of the time left for that program (or column generation): more finds better, less leaves more after.
RESTRICTED_SHARE = 0.1
#: Share of the time left for column generation where memory is tight: more converges more, less leaves more.
TIGHT_GENERATION_SHARE = 0.5
#: Share of the work time for the whole program where memory binds: more proves more, less leaves peak search.
PEAK_WHOLE_SHARE = 0.5
#: Share of the time to the bound's deadline for the promising strategies' program: more for it, less after.
PRICED_SHARE = 0.5
#: Share of the time left for TRW-S in the pruned solve: more ranks strategies better, less solves longer.
PRUNED_TRWS_SHARE = 0.25
#: Share of the time left for the pruned program: more solves it better, less leaves more for the search.
PRUNED_SOLVE_SHARE = 0.25

# When the heuristic hands over to a backend on the whole program.

#: Stall (relative to its last improvement's time) that stops the heuristic: more polishes, less hands over.
HEURISTIC_PATIENCE = 1.0
#: Share of the cost an improvement must gain to count: more stops sooner on small gains, less polishes.
HEURISTIC_MIN_GAIN = 1e-3
#: Least stall in seconds (index: whether the backend solves the relaxation first): more polishes the start.
HEURISTIC_QUIET_S = {False: 1.0, True: 0.25}
#: Least seconds for the heuristic: more gives it a better answer, less leaves more for what follows ...
HEURISTIC_MIN_S = 0.5
#: ... or this share of the time left when that is less.
HEURISTIC_MIN_SHARE = 0.25
#: Share of the limit a memory row needs the incumbent to fill to start in the program: less starts more rows.
LAZY_MEMORY_START = 0.9
