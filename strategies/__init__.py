"""The torch side of planning: from a model, a mesh and a budget to the solver's problem, and back to a plan.

The folders follow the data flow: `models/` (what to plan) -> `graph/` (capture one training step as a
joint forward + backward aten graph) -> `ops/` (per-op sharding rules expanded to the mesh) with `cost/`
(hardware, mesh and communication costs) -> `problem/` (the whole-graph `solver.problem.Problem`) ->
`plan/` (solve, write the plan, explain it, compare baselines). `placement` and `tensor_meta`, at the top,
are the vocabulary every stage shares."""
