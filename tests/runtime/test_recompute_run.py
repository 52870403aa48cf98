"""Plans that recompute activations run on 4 gloo ranks as planned (`runtime.recomputation`).

Under a budget 10% below the smallest peak any plan without recomputation reaches (the planner's own
"smallest peak" answer), the program's plan for the 2-layer GPT and for the `transformers` Llama recomputes;
it runs equal to one process (`run_rank`'s check), with the collectives the plan predicts (kind, count and
bytes: the recomputation's moves again included), a measured peak per rank within 110% of the predicted one,
and below the measured peak of the same placements with nothing recomputed. A recomputed dropout mask is
drawn again from its forward's generator state, and a plan of a short capture recomputes in every layer of
the full depth.
"""

from __future__ import annotations

from typing import Any

import pytest

from runtime import random_ops
from runtime.recomputation import RecomputeMismatch, schedule
from runtime.report import report_text
from solver.errors import InfeasibleError
from strategies.plan.planner import PlanRequest, capture_request, plan_model
from tests.runtime.checked_run import assert_as_planned, run_checked
from tests.runtime.test_planned_step import GPT, HF_LLAMA, LLAMA, USER_MODELS

ZOO_NEOX = f"{USER_MODELS / 'zoo.py'}:gpt_neox"
MODELS = {
    "gpt": {"model": "gpt2-small", "batch": 16, "seq": 64, "layers": 2, "options": GPT},
    "llama": {"model": HF_LLAMA},
}


def request(model: dict[str, Any], **fields: Any) -> PlanRequest:
    return PlanRequest(mesh="4", dtype="float32", time_limit=30, hardware="cpu", **model, **fields)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_budget_only_recomputation_meets_runs_as_planned_in_less_memory(ranks, tmp_path, name) -> None:
    model = MODELS[name]
    with pytest.raises(InfeasibleError) as refused:  # the smallest peak of any plan keeping every value
        plan_model(request(model, recompute="none", memory_gib=1e-6))
    assert refused.value.min_peak
    budget_gib = 0.9 * refused.value.min_peak / 2**30
    plan = plan_model(request(model, memory_gib=budget_gib)).plan
    assert plan["recompute"] and plan["predicted"]["recompute_s"] > 0
    assert plan["predicted"]["peak_memory_bytes"] <= budget_gib * 2**30

    recomputing = run_checked(ranks, plan, model["model"], tmp_path / "recompute.json")
    assert_as_planned(recomputing)
    keeping = run_checked(ranks, {**plan, "recompute": []}, model["model"], tmp_path / "keep.json")
    assert max(recomputing["memory"]["peak_bytes_per_rank"]) < max(keeping["memory"]["peak_bytes_per_rank"])
    assert recomputing["loss"] == pytest.approx(keeping["loss"], rel=1e-5)
    assert recomputing["recompute"]["values"] >= len(plan["recompute"]) > 0
    assert recomputing["recompute"]["ops_made_again"] >= recomputing["recompute"]["values"]
    assert keeping["recompute"] == {"values": 0, "ops_made_again": 0}
    assert f"recomputation: {recomputing['recompute']['values']} values" in report_text(recomputing)


def test_a_recomputed_dropout_mask_is_drawn_again_as_its_forward_drew_it(ranks, tmp_path) -> None:
    """GPT-NeoX with dropout 0.1, every value recomputed: its masks are made again in the backward, and the
    step still equals one process (drawn from another generator state, the check fails: tried)."""
    full = request({"model": ZOO_NEOX}, recompute="full")
    plan = plan_model(full).plan
    entries, _ = schedule(capture_request(full, None)[0], plan)
    drawn_again = [
        e.node for e in entries if e.again and random_ops.draws_random(e.node.target, e.node.args, {})
    ]
    assert len(drawn_again) >= 2  # a mask per dropout of each layer
    report = run_checked(ranks, plan, ZOO_NEOX, tmp_path / "plan.json")
    assert report["random_ops"]["ops"]
    assert_as_planned(report)


def test_a_short_capture_plan_recomputes_in_every_layer_of_the_full_depth(ranks, tmp_path) -> None:
    fields = {"batch": 4, "seq": 16, "layers": 6, "options": LLAMA, "recompute": "full", "baseline": "fsdp"}
    plan = plan_model(request({"model": "llama3-8b"}, **fields)).plan
    assert plan["layers"] == {"captured": 4, "total": 6} and plan["recompute"]
    report = run_checked(ranks, plan, "llama3-8b", tmp_path / "plan.json")
    assert_as_planned(report)


def test_the_schedule_drops_a_recomputed_value_before_its_backward_and_makes_it_again() -> None:
    full = request(MODELS["gpt"], recompute="full")
    plan = plan_model(full).plan
    graph, _ = capture_request(full, full.layers)
    entries, drops = schedule(graph, plan)
    position = {node: index for index, node in enumerate(graph.order)}
    assert plan["recompute"]
    for name in plan["recompute"]:
        runs = [i for i, e in enumerate(entries) if e.node.name == name]
        assert len(runs) == 2 and not entries[runs[0]].again and entries[runs[1]].again
        dropped = [i for i, d in enumerate(drops) if any(n.name == name for n in d)]
        assert len(dropped) == 2 and runs[0] <= dropped[0] < runs[1] < dropped[1]  # gone in between
        assert position[entries[dropped[0]].node] < graph.backward_start  # after its last forward reader
        following = next(e.node for e in entries[runs[1] :] if not e.again)
        assert position[following] >= graph.backward_start  # made again in the backward
    assert len(entries) == len(graph.order) + sum(e.again for e in entries)


def test_a_plan_recomputing_what_the_graph_cannot_make_again_is_refused() -> None:
    kept = request(MODELS["gpt"], recompute="none")
    plan = plan_model(kept).plan
    graph, _ = capture_request(kept, kept.layers)
    backward_op = graph.order[graph.backward_start].name
    for name, said in (
        (backward_op, "its backward cannot make again"),
        ("no_such_op", "this model has no op"),
    ):
        with pytest.raises(RecomputeMismatch, match=f"recomputes {name}, which {said}"):
            schedule(graph, {**plan, "recompute": [name]})
