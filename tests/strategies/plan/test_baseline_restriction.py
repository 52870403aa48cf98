"""``restrict_to_baseline``: a baseline's parameter placements on some mesh axes, the rest free."""

from __future__ import annotations

import numpy as np
import pytest

from solver.solve import SolveOptions, solve
from strategies.plan.baselines import restrict_to_baseline
from strategies.plan.planner import PlanRequest, plan_model


@pytest.fixture(scope="module")
def outcome():
    return plan_model(PlanRequest(model="mlp", mesh="2x2", batch=64, time_limit=60))


def test_only_placements_that_differ_on_the_chosen_axes_are_forbidden(outcome) -> None:
    built = outcome.built
    problem = restrict_to_baseline("megatron", built, ["w1.weight", "w2.weight"], axes=[1])
    for name, tp_code in (("w1.weight", 0), ("w2.weight", 1)):  # column- and row-parallel on the last axis
        index = built.parameter_nodes[name]
        agrees = built.nodes[index].output_specs[:, 0, 1] == tp_code
        costs = problem.node_costs(index)
        assert agrees.any() and (~agrees).any()
        assert np.isinf(costs[~agrees]).all() and np.isfinite(costs[agrees]).all()
    untouched = [i for i in range(len(built.nodes)) if i not in built.parameter_nodes.values()]
    for i in untouched:
        assert np.array_equal(problem.node_costs(i), built.problem.node_costs(i))


def test_the_restricted_optimum_keeps_the_baseline_on_those_axes(outcome) -> None:
    built = outcome.built
    problem = restrict_to_baseline("megatron", built, ["w1.weight"], axes=[1])
    result = solve(problem, SolveOptions(backend="auto", time_limit=60))
    assert result.status == "optimal"
    assert result.cost >= outcome.result.cost * (1 - 1e-9)
    index = built.parameter_nodes["w1.weight"]
    assert built.nodes[index].output_specs[result.solution[index], 0, 1] == 0


def test_axes_outside_the_mesh_are_refused(outcome) -> None:
    with pytest.raises(ValueError, match="axes"):
        restrict_to_baseline("megatron", outcome.built, axes=[2])
