"""The runtime: a plan applied to a real module with DTensor across processes, and trained.

Takes a plan (JSON version 1), the module it was made for and a device mesh; gives the module's parameters as
DTensors in their planned placements and a training step that runs the captured graph node by node in the
plan's placements (`planned_step`: `apply_plan`). `worker` is one rank of `autoshard run` (build, apply,
train, check against one process, count collectives); `launch` starts the ranks (PyTorch's elastic launcher,
or the caller's `torchrun`); `report` prints what ran beside what the plan predicted.
"""
