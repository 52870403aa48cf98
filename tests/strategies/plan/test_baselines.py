"""Hand-written baselines under the planner's cost model, against the ILP plan on the same problem."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from solver.solve import SolveOptions, solve
from strategies.cost.comm import redistribute_steps
from strategies.cost.mesh import make_mesh
from strategies.placement import R, spec_text
from strategies.plan.baselines import BASELINES, _pin, baseline_pins, solve_baseline
from strategies.plan.plan_json import plan_moves
from strategies.plan.planner import PlanRequest, plan_model
from strategies.problem.builder import placeholder_node
from strategies.problem.comm_roles import PARAMETER
from strategies.tensor_meta import TensorMeta

TIME_LIMIT = 60.0  # small problems: both the plan and the baselines solve to optimality
TOLERANCE = 1e-9


def _plan(mesh: str, batch: int) -> tuple:
    # gap 0: the time-optimal plan (within a gap the plan may trade up to it for a smaller peak)
    outcome = plan_model(PlanRequest(model="mlp", mesh=mesh, batch=batch, time_limit=TIME_LIMIT, gap=0.0))
    assert outcome.result.status == "optimal"
    return outcome


@pytest.fixture(scope="module", params=[64, 65536], ids=["batch64", "batch65536"])
def solved(request):
    outcome = _plan("4", request.param)
    results = {name: solve_baseline(name, outcome.built, TIME_LIMIT) for name in BASELINES}
    return outcome, results


def test_baselines_never_beat_the_plan(solved):
    outcome, results = solved
    ilp = outcome.plan["predicted"]["step_time_s"]
    for name in ("ddp", "fsdp", "megatron"):
        result = results[name]
        assert result.feasible and result.status == "optimal", (name, result)
        assert result.step_time_s >= ilp * (1 - 1e-6) - TOLERANCE, (name, result.step_time_s, ilp)
        assert result.peak_memory_bytes > 0
        assert result.message == ""
    assert results["fsdp_tp"].status == "not_applicable" and not results["fsdp_tp"].feasible


def _spec(built, index, solution):
    return spec_text(built.nodes[index].output_specs[solution[index], 0])


def test_ddp_replicates_parameters_and_all_reduces_gradients(solved):
    outcome, results = solved
    built, ddp = outcome.built, results["ddp"]
    for name, index in built.parameter_nodes.items():
        assert _spec(built, index, ddp.solution) == ["R"], name
        assert _spec(built, built.gradient_nodes[name], ddp.solution) == ["R"]
    assert _spec(built, built.input_nodes[0], ddp.solution) == ["S(0)"]
    if outcome.plan["request"]["batch"] < 1024:
        return  # a tiny batch is cheaper to gather than to reduce gradients over
    # Each weight's gradient is all-reduced once, on the gradient edge or on the activation edge that
    # carries it just before (a partial sum ahead of the transpose that ends in the sink).
    chosen = ddp.solution
    reduced: list[tuple[int, ...]] = []
    for edge in built.edges:
        producer, consumer = built.nodes[edge.producer], built.nodes[edge.consumer]
        meta = producer.outputs[edge.output]
        src = tuple(int(c) for c in producer.output_specs[chosen[edge.producer], edge.output])
        dst = tuple(int(c) for c in consumer.input_specs[chosen[edge.consumer], edge.argument])
        steps = redistribute_steps(built.mesh, meta.shape, meta.itemsize, src, dst)
        if any(step.collective == "all_reduce" for step in steps):
            reduced.append(tuple(sorted(meta.shape)))
        assert not any(step.collective == "reduce_scatter" for step in steps)
    weights = [
        tuple(sorted(built.nodes[built.parameter_nodes[n]].outputs[0].shape))
        for n in ("w1.weight", "w2.weight")
    ]
    for shape in weights:
        assert reduced.count(shape) == weights.count(shape), (shape, reduced)
    assert ddp.predicted["collectives"]["all_reduce"] >= 2


def test_fsdp_and_megatron_pins(solved):
    outcome, _ = solved
    built = outcome.built

    def specs(name):
        return {
            p: spec_text(built.nodes[i].output_specs[s, 0])
            for i, s in baseline_pins(name, built).items()
            for p in [built.nodes[i].name]
        }

    fsdp = specs("fsdp")
    assert all(fsdp[p] == ["S(0)"] for p in built.parameter_nodes)
    megatron = specs("megatron")
    assert megatron["w1.weight"] == ["S(0)"] and megatron["w1.bias"] == ["S(0)"]
    assert megatron["w2.weight"] == ["S(1)"] and megatron["w2.bias"] == ["R"]
    assert megatron[built.nodes[built.input_nodes[0]].name] == ["R"]  # 1-D: pure tensor parallel
    # the batch pin goes on every input with the first input's batch size (the input and its target)
    assert set(baseline_pins("ddp", built, ["w1.weight"])) == {built.parameter_nodes["w1.weight"]} | set(
        built.input_nodes
    )


def test_megatron_moves_activations_never_its_weights():
    """At a large batch, gathering the small weights over the tensor-parallel axis is cheaper than moving the
    activations: with the parameters pinned alone the solver does that (FSDP over the axis). The baseline
    keeps every weight's shard up to the matmul that reads it."""
    built = _plan("4", 65536).built

    def parameter_moves(solution) -> list:
        runs = plan_moves(built, np.asarray(solution, dtype=np.int64))
        return [m for m in runs.moves if built.roles()[m.edge] == PARAMETER]

    pinned = built.problem.replace(pins={**built.problem.pins, **baseline_pins("megatron", built)})
    assert parameter_moves(
        solve(pinned, SolveOptions(time_limit=TIME_LIMIT)).solution
    )  # the weights gathered
    megatron = solve_baseline("megatron", built, TIME_LIMIT)
    assert megatron.feasible and megatron.status == "optimal"
    assert parameter_moves(megatron.solution) == []
    assert megatron.predicted["collectives"], "Megatron moves activations instead"


def test_fsdp_tp_on_a_2d_mesh():
    outcome = _plan("2x2", 64)
    built = outcome.built
    result = solve_baseline("fsdp_tp", built, TIME_LIMIT)
    assert result.feasible
    assert result.step_time_s >= outcome.plan["predicted"]["step_time_s"] * (1 - 1e-6) - TOLERANCE
    pins = baseline_pins("fsdp_tp", built)
    spec = {built.nodes[i].name: spec_text(built.nodes[i].output_specs[s, 0]) for i, s in pins.items()}
    assert spec["w1.weight"] == ["S(0)", "S(0)"] and spec["w2.weight"] == ["S(0)", "S(1)"]
    assert spec["w2.bias"] == ["S(0)", "R"]
    assert spec[built.nodes[built.input_nodes[0]].name] == ["S(0)", "R"]


def test_infeasible_memory_is_a_result_not_an_error(solved):
    outcome, _ = solved
    tight = dataclasses.replace(outcome.built, problem=outcome.built.problem.replace(usage_limit=1024))
    result = solve_baseline("ddp", tight, 5.0)
    assert not result.feasible and result.status == "infeasible" and result.message
    assert result.step_time_s is None


def test_impossible_pin_falls_back_to_replicated_and_says_so():
    mesh = make_mesh("4", None, "h100")
    node = placeholder_node("x", "input", TensorMeta.of(torch.empty(2, 8, device="meta")), mesh)
    notes: list[str] = []
    index = _pin(node, (0,), "input x", notes)
    assert tuple(node.output_specs[index, 0]) == (R,)
    assert len(notes) == 1 and "S(0)" in notes[0] and "using ['R']" in notes[0], notes
    mesh2 = make_mesh("2x4", None, "h100")
    node2 = placeholder_node("x", "input", TensorMeta.of(torch.empty(4, 8, device="meta")), mesh2)
    index = _pin(node2, (0, 0), "input x", notes)  # 2 x 4 pieces of 4 rows: keep the first axis only
    assert tuple(node2.output_specs[index, 0]) == (0, R)


def test_unknown_baseline(solved):
    outcome, _ = solved
    with pytest.raises(ValueError, match="unknown baseline"):
        solve_baseline("zero3", outcome.built)
    with pytest.raises(ValueError, match="no such parameter"):
        baseline_pins("ddp", outcome.built, ["nope"])
    assert np.all(np.isin(list(BASELINES), ["ddp", "fsdp", "hsdp", "megatron", "fsdp_tp"]))
