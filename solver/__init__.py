"""The solver: pure optimisation, no torch. Takes a `Problem` (nodes with strategies, edge cost matrices,
memory over time), gives the cheapest assignment that fits, with a proven lower bound and the gap.

At the top: the problem model (`problem`, `compact`, `evaluate`, `errors`, the IOPDDL format `iopddl`), the
integer program (`ilp`), exact `reductions`, and the pipeline `solve` (its `path`, the `context` its
`phases` and `priced_phases` share, a backend on a `whole` program, the tuning constants in `policy`); below,
the stages it calls: `heuristics/` (feasible answers fast), `bounds/` (certificates), `backends/` (exact
solvers), `large/` (programs too big for a backend whole)."""
