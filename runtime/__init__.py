"""The runtime: a plan applied to a real module with DTensor across processes, and trained.

Takes a plan (JSON version 1), the module it was made for and a device mesh. `plan_checks` refuses a plan
that does not fit (another version, mesh or model) and reads its placements per op node; `planned_step` runs
the captured graph node by node in those placements (`recomputation` orders it where the plan recomputes,
`random_ops` draws as one process does, `full_depth` maps a short capture's plan onto every layer); `apply`
makes the module's parameters DTensors in their planned placements and gives the step (`apply_plan`).
`worker` is one rank of `autoshard run` (build, apply,
train, check against one process, count collectives); `launch` starts the ranks (PyTorch's elastic launcher,
or the caller's `torchrun`); `report` prints what ran beside what the plan predicted.
"""
