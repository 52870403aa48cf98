"""Known answers: the planner rediscovers what experts do, under the cost model (issue 4, section 4).

The ``mlp`` model is ``w2(gelu(w1(x)))`` with a summed squared-error loss, planned on a 1-D mesh of 4
(h100, bf16). Every plan here is solved to proven optimality (gap 0).
"""

from __future__ import annotations

import json

import pytest

from strategies.plan.planner import PlanRequest, plan_model

WEIGHTS = ("w1.weight", "w2.weight")


def _plan(**request: object) -> dict:
    plan = plan_model(PlanRequest(model="mlp", mesh="4", time_limit=60, gap=0.0, **request)).plan
    assert plan["solver"]["status"] == "optimal" and plan["solver"]["gap"] == pytest.approx(0, abs=1e-9)
    return plan


def _first_matmul(plan: dict) -> dict:
    return next(n for n in plan["nodes"] if n["op"] in ("aten.addmm.default", "aten.mm.default"))


def test_large_weights_and_a_small_batch_are_planned_megatron_style() -> None:
    plan = _plan(batch=8, options={"d": 8192, "h": 32768})
    params = plan["parameters"]
    assert params["w1.weight"] == ["S(0)"] and params["w1.bias"] == ["S(0)"]  # column parallel
    assert params["w2.weight"] == ["S(1)"]  # row parallel
    # One all-reduce of the partial output, which the loss and the loss's backward both read replicated: the
    # objective prices it once per consumer, the prediction (and the runtime) move it once.
    assert plan["predicted"]["collectives"] == {"all_reduce": 1}
    assert plan["predicted"]["step_time_s"] < plan["solver"]["objective"]


def test_tiny_weights_and_a_big_batch_are_planned_data_parallel() -> None:
    plan = _plan(batch=65536)
    assert all(spec == ["R"] for spec in plan["parameters"].values())  # weights replicated
    assert _first_matmul(plan)["inputs"][1] == ["S(0)"]  # the batch is sharded
    # Gradients all-reduced: one per parameter, plus the scalar loss.
    assert plan["predicted"]["collectives"] == {"all_reduce": len(plan["parameters"]) + 1}
    # Each rank loads only its quarter of the batch: the plan names the placement a data loader delivers.
    assert plan["inputs"] == [["S(0)"], ["S(0)"]]


def test_an_input_costs_its_local_bytes_over_the_host_link() -> None:
    from strategies.cost.hardware import PRESETS

    plan = _plan(batch=65536)
    d = 1024  # the mlp's default width: x and the target are both [batch, d] in bf16
    local_bytes = 2 * (65536 // 4) * d * 2
    assert plan["predicted"]["load_s"] == pytest.approx(local_bytes / PRESETS["h100"].host_to_device)


def test_a_budget_below_the_replicated_footprint_shards_the_parameters() -> None:
    options = {"d": 2048, "h": 8192}
    free = _plan(batch=16384, options=options)
    assert all(spec == ["R"] for spec in free["parameters"].values())  # data parallel when memory allows
    weights = 2 * 2048 * 8192
    replicated_footprint = weights * (2 + 2 + 8)  # bf16 parameter and gradient, two fp32 Adam moments
    budget_gib = 0.34
    assert budget_gib * 2**30 < replicated_footprint
    plan = _plan(batch=16384, options=options, memory_gib=budget_gib)
    assert plan["predicted"]["peak_memory_bytes"] <= budget_gib * 2**30
    assert all(plan["parameters"][w] != ["R"] for w in WEIGHTS)  # stored sharded (FSDP-like)
    assert plan["predicted"]["collectives"].get("all_gather", 0) >= 1  # gathered for use
    assert plan["predicted"]["step_time_s"] >= free["predicted"]["step_time_s"]


def test_a_budget_nothing_fits_is_refused_with_the_smallest_reachable_peak() -> None:
    from solver.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match="smallest peak") as refused:
        _plan(batch=16384, options={"d": 2048, "h": 8192}, memory_gib=0.1)
    message = str(refused.value)
    assert message.startswith("no plan fits the budget of 0.1 GiB per device:"), message
    assert refused.value.min_peak > 0.1 * 2**30
    assert message.endswith(f"{refused.value.min_peak / 2**20:.1f} MiB per device"), message


def test_a_refused_budget_speaks_of_the_hardware_capacity_when_none_was_given() -> None:
    from solver.errors import InfeasibleError
    from strategies.cost.mesh import make_mesh
    from strategies.plan.planner import _budget_error

    mesh = make_mesh("4", None, "h100")
    solver_error = InfeasibleError("usage_limit 1 cannot be met", min_peak=90 * 2**30, min_peak_exact=False)
    error = _budget_error(solver_error, PlanRequest(model="mlp", mesh="4"), mesh)
    assert str(error) == (
        "no plan fits the h100's capacity of 80.0 GiB per device: "
        "the smallest peak any plan can reach is at least 90.0 GiB per device"
    )
    assert error.min_peak == 90 * 2**30 and not error.min_peak_exact


def test_the_plan_json_has_the_documented_fields(tmp_path) -> None:
    plan = _plan(batch=64)
    for key in ("version", "mesh", "parameters", "inputs", "nodes", "predicted", "solver"):
        assert key in plan
    assert plan["version"] == 1 and plan["mesh"]["shape"] == [4]
    for key in ("step_time_s", "compute_s", "load_s", "comm_s", "comm_bytes", "peak_memory_bytes"):
        assert key in plan["predicted"]
    predicted = plan["predicted"]
    assert predicted["load_s"] > 0
    assert predicted["step_time_s"] == pytest.approx(
        predicted["compute_s"] + predicted["load_s"] + predicted["comm_s"]
    )
    assert plan["predicted"]["step_time_s"] == pytest.approx(plan["solver"]["objective"])
    for key in ("backend", "status", "objective", "bound", "gap", "seconds", "variables", "constraints"):
        assert key in plan["solver"]
    json.loads(json.dumps(plan))  # serialisable as is


def test_within_the_gap_the_plan_with_the_least_peak_is_taken() -> None:
    # The data-parallel MLP (tiny weights, big batch), its fastest plan at 55% of a 1 GiB budget: sharding its
    # weights (and their Adam state) costs 0.5% of step time and frees their replicas; within the 1% asked
    # for, that plan is taken.
    gap = 0.01
    request = PlanRequest(model="mlp", mesh="4", batch=65536, memory_gib=1.0, time_limit=60, gap=gap)
    plan = plan_model(request).plan
    predicted, solver = plan["predicted"], plan["solver"]
    fastest = predicted["fastest"]
    assert predicted["peak_memory_bytes"] < fastest["peak_memory_bytes"]
    assert fastest["step_time_s"] < predicted["step_time_s"] <= fastest["step_time_s"] * (1 + gap)
    assert solver["objective"] <= solver["bound"] / (1 - gap) and solver["gap"] <= gap
    assert plan["parameters"]["w1.weight"] == ["S(0)"]


def test_the_plan_kept_for_its_headroom_simulates_within_the_gap_of_the_fastest() -> None:
    # llama3-8b on 8x8: an answer peaking at 31 GiB, within 1% of the fastest (54.7 GiB) by the objective
    # (its gathers credited as hidden as the fastest plan's are), simulated 7% slower: the pass refuses it
    gap = 0.01
    plan = plan_model(PlanRequest(model="llama3-8b", mesh="8x8", batch=16, seq=8192, gap=gap)).plan
    predicted = plan["predicted"]
    fastest = predicted.get("fastest", predicted)
    assert predicted["step_time_s"] <= fastest["step_time_s"] * (1 + gap)


def test_a_hand_written_layout_is_planned_as_it_is_without_headroom() -> None:
    plan = plan_model(PlanRequest(model="mlp", mesh="4", batch=65536, baseline="ddp")).plan
    assert "fastest" not in plan["predicted"]
    assert all(spec == ["R"] for spec in plan["parameters"].values())


def test_no_headroom_pass_where_most_memory_is_free_already() -> None:
    # the same MLP on an 80 GiB device: its peak (568 MiB) is far below a quarter of the memory
    plan = plan_model(PlanRequest(model="mlp", mesh="4", batch=65536, time_limit=60)).plan
    assert "fastest" not in plan["predicted"]
    assert all(spec == ["R"] for spec in plan["parameters"].values())
