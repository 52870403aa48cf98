"""The two-stream schedule (`strategies/plan/schedule.py`): what a plan's collectives hide behind, what the
compute waits for, and the credit the program prices hidden collectives with."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from strategies.plan.plan_json import earned_credit, plan_moves, predict
from strategies.plan.planner import PlanOutcome, PlanRequest, plan_model
from strategies.plan.schedule import simulate
from strategies.problem.builder import recredit
from strategies.problem.comm_roles import ACTIVATION, GRADIENT, PARAMETER

SMALL_LLAMA = {"dim": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 8, "ffn_dim": 1536, "vocab_size": 4096}


def plan(baseline: str, hardware: str = "h100") -> PlanOutcome:
    request = PlanRequest(
        model="llama3-8b", mesh="8", batch=16, seq=512, options=SMALL_LLAMA, dtype="float32",
        compute_dtype="bfloat16", baseline=baseline, hardware=hardware, recompute="none", time_limit=30,
    )  # fmt: skip
    return plan_model(request)


@pytest.fixture(scope="module")
def fsdp() -> PlanOutcome:
    return plan("fsdp")


@pytest.fixture(scope="module")
def megatron() -> PlanOutcome:
    return plan("megatron")


def chosen(outcome: PlanOutcome) -> np.ndarray:
    return np.asarray(outcome.result.solution, dtype=np.int64)


def test_fsdp_gathers_run_ahead_of_their_layer_and_hide(fsdp) -> None:
    predicted = fsdp.plan["predicted"]
    # the first layer's gathers come before any compute: exposed
    assert predicted["hidden_share"][PARAMETER] > 0.8 and predicted["hidden_share"][GRADIENT] > 0.8
    assert predicted["exposed_comm_s"] < 0.5 * predicted["comm_s"]
    parts = (
        predicted["compute_s"] + predicted["load_s"] + predicted["exposed_comm_s"] + predicted["contention_s"]
    )
    assert predicted["step_time_s"] == pytest.approx(parts, rel=1e-9)


def test_tensor_parallel_moves_are_waited_for(megatron) -> None:
    runs = plan_moves(megatron.built, chosen(megatron))
    schedule = simulate(megatron.built, chosen(megatron), runs.moves, runs.closure_s)
    activation = schedule.comm_by_kind[ACTIVATION]
    assert schedule.hidden_by_kind[ACTIVATION] < 0.1 * activation
    assert schedule.exposed_comm_s > 0.9 * activation


def test_a_layers_gathers_pay_their_launch_and_latency_once(fsdp) -> None:
    runs = plan_moves(fsdp.built, chosen(fsdp))
    schedule = simulate(fsdp.built, chosen(fsdp), runs.moves, runs.closure_s)
    whole = sum(move.seconds for move in runs.moves)
    fixed = sum(move.fixed_s for move in runs.moves)
    assert whole - fixed < schedule.comm_s < whole  # buckets share the fixed cost


def test_hiding_costs_the_compute_what_overlap_slowdown_says(fsdp) -> None:
    built, picked = fsdp.built, chosen(fsdp)
    runs = plan_moves(built, picked)
    free = simulate(built, picked, runs.moves, runs.closure_s, overlap_slowdown=0.0)
    half = simulate(built, picked, runs.moves, runs.closure_s, overlap_slowdown=0.5)
    assert free.contention_s == 0 and half.contention_s == pytest.approx(0.5 * free.hidden_comm_s, rel=1e-9)
    assert half.step_time_s - free.step_time_s == pytest.approx(half.contention_s, rel=1e-9)


def test_the_credit_is_the_hidden_share_less_what_hiding_costs(fsdp) -> None:
    built = fsdp.built
    shares = fsdp.plan["predicted"]["hidden_share"]
    keep = 1.0 - built.mesh.hardware.overlap_slowdown
    credit = earned_credit(built, fsdp.plan["predicted"])
    assert credit[PARAMETER] == pytest.approx(shares[PARAMETER] * keep, abs=1e-4)
    assert credit[GRADIENT] == pytest.approx(shares[GRADIENT] * keep, abs=1e-4)


def test_recrediting_scales_the_parameter_and_gradient_edges_only(fsdp) -> None:
    built = fsdp.built
    again = recredit(built, {PARAMETER: 0.5, GRADIENT: 0.25})
    before, after = built.problem, again.problem
    scale = {PARAMETER: 0.5, GRADIENT: 0.75, ACTIVATION: 1.0}
    for e, role in enumerate(built.roles()):
        old, new = before.edge_matrix(e), after.edge_matrix(e)
        finite = np.isfinite(old) & (old < 1e18)
        assert np.allclose(new[finite], old[finite] * scale[role] / (1 - built.credit.get(role, 0.0)))
    assert {role for role in built.roles()} == {PARAMETER, GRADIENT, ACTIVATION}
    assert predict(again, chosen(fsdp))["step_time_s"] == fsdp.plan["predicted"]["step_time_s"]


def test_a_runtime_that_overlaps_well_earns_the_program_a_credit(tmp_path: Path) -> None:
    hardware = tmp_path / "overlapping.json"
    hardware.write_text(json.dumps({"base": "h100", "overlap_slowdown": 0.2}), encoding="utf-8")
    outcome = plan("fsdp", str(hardware))
    assert outcome.built.credit[PARAMETER] == pytest.approx(
        0.8
    )  # the first solve assumes every gather hidden
    assert outcome.plan["predicted"]["contention_s"] > 0
