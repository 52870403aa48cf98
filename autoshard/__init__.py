"""autoshard as a library: plan a PyTorch module (or a graph a launcher exported) on a device mesh, apply the
plan, and train in your own loop.

    import autoshard

    with autoshard.meta_init():                                          # no memory, no initialisation
        model = MyModel()
    plan = autoshard.plan(model, example_inputs, mesh, memory_gib=80)   # every rank gets rank 0's plan
    step = autoshard.apply(model, plan, mesh, example_inputs)            # each rank makes its own shards
    optimizer = torch.optim.AdamW(model.parameters())
    loss = step(batch).loss; optimizer.step()

The four packages behind it stay where they are (``strategies``: capture, op rules, cost model, problem,
plan; ``solver``; ``runtime``; ``service``); this package is the part a launcher imports.
``docs/python-api.md`` has a runnable example.
"""

from __future__ import annotations

from autoshard.api import Plan, apply, export_graph, load_plan, plan
from runtime.apply import AppliedPlan
from runtime.parameter_shards import meta_parameters as meta_init
from runtime.plan_checks import PlanMismatch
from service.client import AutoshardClient as Client
from service.client import ServiceError
from solver.errors import InfeasibleError

__all__ = [
    "AppliedPlan",
    "Client",
    "InfeasibleError",
    "Plan",
    "PlanMismatch",
    "ServiceError",
    "apply",
    "export_graph",
    "load_plan",
    "meta_init",
    "plan",
]
