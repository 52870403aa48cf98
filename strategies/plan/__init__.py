"""Plans: solve a built problem and write the plan; explain it; compare hand-written baselines.

Takes a `PlanRequest` (`planner`: model, mesh, budget, solver options); gives plan JSON version 1
(`plan_json`: placements, predicted costs, the certificate), the reasons for one placement (`explain`)
and DDP / FSDP / Megatron / FSDP x TP under the same cost model (`baselines`)."""
