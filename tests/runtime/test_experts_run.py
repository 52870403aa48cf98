"""Mixture-of-experts models with their experts sharded, run on 4 gloo ranks as planned.

``transformers`` Mixtral and Qwen2-MoE from the zoo, planned on a 2x2 ``dp,tp`` mesh with their stacked
expert weights pinned ``S(0)`` on one axis (at these sizes the solver would replicate them), and a
16-expert Mixtral planned on the ``cpu`` preset, where the planner also runs a forward product on each
rank's experts. Each run checks itself against one process (loss, every gradient, every parameter after
two steps); the test asserts every op came out where planned and the collectives DTensor ran are the
plan's, kind, count and bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.worker import RunOptions, run_rank
from strategies.plan.planner import PlanRequest, plan_model

USER_MODELS = Path(__file__).resolve().parents[1] / "strategies" / "models" / "user_models"
ZOO = USER_MODELS / "zoo.py"
EXPERT_WEIGHTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
GROUPED_MM = "autoshard.grouped_mm.default"

CASES = {
    # name -> (model, experts pinned to, hardware)
    "mixtral-experts-over-dp": (f"{ZOO}:mixtral", ["S(0)", "R"], "h100"),
    "qwen2-moe-experts-over-tp": (f"{ZOO}:qwen2_moe", ["R", "S(0)"], "h100"),
    "mixtral-16-experts-over-dp": (f"{USER_MODELS / 'hf_mixtral.py'}:factory", ["S(0)", "R"], "cpu"),
}
FORWARD_EXPERT_PARALLEL = {"mixtral-16-experts-over-dp"}
"""Cases whose experts outweigh their tokens: the planner runs the tokens through each rank's experts."""


def _plan(tmp: Path, name: str) -> dict:
    model, pinned, hardware = CASES[name]
    pins = {f"model.layers.{i}.{w}": pinned for i in range(2) for w in EXPERT_WEIGHTS}
    request = PlanRequest(
        model=model,
        mesh="2x2",
        axis_names="dp,tp",
        hardware=hardware,
        dtype="float32",
        parameter_placements=pins,
        time_limit=30,
    )
    return plan_model(request).plan


def _expert_parallel(plan: dict) -> list[str]:
    """Nodes of ``plan`` running a grouped product on each rank's own experts (the experts' dim cut)."""
    return [
        node["name"]
        for node in plan["nodes"]
        if node["op"] == GROUPED_MM and any(p.startswith("S(0)") for p in node["inputs"][2])
    ]


@pytest.mark.parametrize("name", list(CASES))
def test_experts_sharded_over_an_axis_run_as_planned_and_equal_one_process(ranks, tmp_path, name) -> None:
    plan = _plan(tmp_path, name)
    experts = {k: v for k, v in plan["parameters"].items() if k.endswith(EXPERT_WEIGHTS)}
    assert all("S(0)" in spec for spec in experts.values()), experts
    assert _expert_parallel(plan)  # at least the weight gradients: each rank its own experts'
    if name in FORWARD_EXPERT_PARALLEL:
        _assert_forward_expert_parallel(plan)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    reports = ranks.run(
        run_rank, RunOptions(model=CASES[name][0], plan=str(path), steps=2, lr=1e-3, check=True)
    )
    for rank, report in enumerate(reports):
        assert isinstance(report, dict), f"rank {rank}: {report}"
    report = reports[0]
    assert report["checked"] and report["deviations"] == []
    collectives = report["collectives"]
    assert collectives["measured"] == collectives["expected_on_backend"], collectives
    assert collectives["measured_bytes"] == collectives["predicted_bytes"], collectives
    assert sum(collectives["measured"].values()) > 0


def _assert_forward_expert_parallel(plan: dict) -> None:
    """Some product of the forward or of the input gradients takes the tokens whole and the weights cut by
    expert on an axis, its result a partial sum there (reduced by an all-reduce): tokens to their experts'
    rank and back."""
    forward = [
        node
        for node in plan["nodes"]
        if node["op"] == GROUPED_MM and node["name"] in _expert_parallel(plan) and "P" in node["output"][0]
    ]
    assert forward, "no grouped product ran expert-parallel with a partial result"
    for node in forward:
        axis = node["output"][0].index("P")
        assert [spec[axis] for spec in node["inputs"]] == ["R", "S(0)", "S(0)", "S(0)"]
    assert plan["predicted"]["collectives"].get("all_reduce", 0) > 0
