"""Compile every numba kernel a plan uses, once, at install (`make setup`): numba's on-disk cache then serves
the first real plan, which would otherwise spend seconds compiling the cost model's and the memory search's
kernels (a 2-layer GPT-2's first plan took 2.8 s longer than the next)."""

from __future__ import annotations

from solver.solve import warm_up_kernels
from strategies.plan.planner import PlanRequest, plan_model

#: A model small enough to plan in a second, on a mesh with two axes (every collective kind).
TINY = {"model": "mlp", "mesh": "2x2", "batch": 64, "options": {"d": 64, "h": 256}, "time_limit": 10.0}


def warm_up() -> None:
    """The solver's kernels on a tiny problem, then a tiny plan with a memory limit that binds (half the
    replicated peak): the cost model's, the problem builder's and the memory-priced search's kernels."""
    warm_up_kernels()
    replicated = plan_model(PlanRequest(**TINY, baseline="ddp")).plan
    half = replicated["predicted"]["peak_memory_bytes"] / 2 / 2**30
    plan_model(PlanRequest(**TINY, memory_gib=half))


if __name__ == "__main__":
    warm_up()
