"""Pipeline plans run on 4 gloo ranks (`runtime.pipeline_step`): each rank its stages, in the planned
schedule.

The planner's pipeline plans for the 2-layer GPT (its head untied) on pp 2 x dp 2 (1F1B) and pp 2 x tp 2
(GPipe; zero-bubble with full recomputation), GPT-2 as it is, its head tied to the embedding, on pp 2 x tp 2
(the weight held on both ranks, its gradient sent once per step), the `transformers` Llama on pp 2 x dp 2
(zero-bubble) and pp 2 x tp 2 (1F1B), the 4-layer GPT on pp 4 (zero-bubble) and interleaved on pp 2 x dp 2,
the 6-layer GPT planned from a 4-layer capture (each layer run as the captured one standing for it)
zero-bubble with 2 stages per rank on pp 2 x dp 2, the zoo's GPT-NeoX with dropout on and everything
recomputed on pp 2 x tp 2 (each mask its micro-batch's, drawn again in the backward) and `transformers`'
GPT-2 as it is (layers `transformer.h.<i>`, dropout on, the head tied) on pp 2 x tp 2 train two AdamW steps
equal to one process on the same micro-batches (`run_rank`'s check: the loss, every gradient of the first
step, every parameter after the last); a zero-bubble schedule (chosen where none is asked) runs each
backward as B and W apart; every rank sends exactly the bytes the plan's cuts (and exchanges) say, runs
exactly the collectives its stages' plan says (kinds, counts, bytes), and holds at its peak no more than 110%
of its stage's predicted peak. Every plan runs on `torch.distributed.pipelining`'s `PipelineStage` objects
under torch's schedule class for it (`runtime.pipeline_stages`; the tied heads' contributions to the
embedding's gradient beside torch's sends); the runtime's own loop, its fallback, makes the same step.
"""

from __future__ import annotations

from typing import Any

import pytest

from runtime.report import report_text
from service.plan_view import summary
from strategies.plan.planner import PlanRequest, plan_model
from tests.runtime.checked_run import run_checked
from tests.runtime.test_planned_step import GPT, HF_LLAMA
from tests.runtime.test_zoo import ZOO

UNTIED_GPT = {
    "model": "gpt2-small",
    "batch": 8,
    "seq": 32,
    "layers": 2,
    "options": {**GPT, "tie_embeddings": False},
}
CASES = {  # without a schedule: chosen (zero-bubble, for these)
    "gpt pp2 x dp2": (UNTIED_GPT, "2x2", "pp,dp", {"schedule": "1f1b"}),
    "gpt pp4": ({**UNTIED_GPT, "layers": 4}, "4", "pp", {}),
    "llama pp2 x dp2": ({"model": HF_LLAMA}, "2x2", "pp,dp", {}),
    "llama pp2 x tp2": ({"model": HF_LLAMA}, "2x2", "pp,tp", {"schedule": "1f1b"}),
    "gpt interleaved": ({**UNTIED_GPT, "layers": 4}, "2x2", "pp,dp", {"schedule": "interleaved-1f1b"}),
    "gpt gpipe": (UNTIED_GPT, "2x2", "pp,tp", {"schedule": "gpipe"}),
    "gpt recomputed": (UNTIED_GPT, "2x2", "pp,tp", {"recompute": "full"}),
    "gpt tied pp2 x tp2": ({**UNTIED_GPT, "options": GPT}, "2x2", "pp,tp", {}),
    "gpt 6 layers from a 4-layer capture": (
        {**UNTIED_GPT, "layers": 6},
        "2x2",
        "pp,dp",
        {"captured_layers": 4, "schedule": "zero-bubble"},
    ),
    "gpt-neox with dropout, recomputed": (
        {"model": f"{ZOO}:gpt_neox"},
        "2x2",
        "pp,tp",
        {"recompute": "full"},
    ),
    "transformers gpt-2, tied, with dropout": ({"model": f"{ZOO}:gpt2"}, "2x2", "pp,tp", {}),
}
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",
}
DROPOUT = {"gpt-neox with dropout, recomputed", "transformers gpt-2, tied, with dropout"}
TWO_STAGES_PER_RANK = {"gpt interleaved", "gpt 6 layers from a 4-layer capture"}
TIED = {"gpt tied pp2 x tp2", "transformers gpt-2, tied, with dropout"}


def pipeline_plan(model: dict[str, Any], mesh: str, axis_names: str, **fields: Any) -> dict[str, Any]:
    request = PlanRequest(
        mesh=mesh, axis_names=axis_names, dtype="float32", time_limit=30, hardware="cpu", **model, **fields
    )
    return plan_model(request).plan


@pytest.mark.parametrize("case", list(CASES))
def test_a_pipeline_plan_runs_its_schedule_equal_to_one_process(ranks, tmp_path, case: str) -> None:
    model, mesh, axis_names, fields = CASES[case]
    plan = pipeline_plan(model, mesh, axis_names, **fields)
    pipeline = plan["pipeline"]
    assert pipeline["schedule"] == fields.get("schedule", "zero-bubble")
    assert bool(plan.get("recompute")) == ("recompute" in fields)
    assert pipeline["chunks"] == (2 if case in TWO_STAGES_PER_RANK else 1)

    report = run_checked(ranks, plan, model["model"], tmp_path / "plan.json")

    ran = report["pipeline"]
    stages = len(pipeline["stages"])
    assert sorted(s for rank in ran["ranks"] for s in rank["stages"]) == sorted(
        list(range(stages)) * (4 // int(mesh.split("x")[0]))
    )
    for rank, (measured, peak) in enumerate(
        zip(ran["ranks"], report["memory"]["peak_bytes_per_rank"], strict=True)
    ):
        assert measured["sent_bytes"] == measured["predicted_sent_bytes"] > 0, (rank, measured)
        # its stages' collectives, every micro-batch: kinds, counts and bytes
        assert measured["collectives"] == measured["predicted_collectives"], (rank, measured)
        assert measured["collective_bytes"] == measured["predicted_collective_bytes"], (rank, measured)
        assert 0 < peak <= 1.1 * measured["predicted_peak_bytes"], (rank, peak, measured)
        backward = sum(measured["backward_s"]) + sum(measured["weight_s"])
        assert len(measured["predicted_s"]) == len(measured["stages"]) and min(measured["predicted_s"]) > 0
        assert measured["step_s"] >= sum(measured["forward_s"]) + backward
        # a zero-bubble schedule runs every stage's parameters' gradients (W) apart from its B
        assert (sum(measured["weight_s"]) > 0) == (pipeline["schedule"] == "zero-bubble"), measured
    assert ran["sent_bytes_match"] and ran["collectives_match"]
    # torch's stages and schedule class ran it (the tied head's contribution to the embedding's gradient, with
    # no forward slot of its shape to ride back in, beside torch's sends)
    assert ran["torch_schedule"] == TORCH_SCHEDULES[pipeline["schedule"]] and ran["own_loop_because"] is None
    if case == "gpt recomputed":  # the last stage's head reduces more than the first stage
        first, last = (ran["ranks"][rank]["collectives"]["all_reduce"] for rank in (0, 3))
        assert 0 < first < last, ran["ranks"]
    # one step's sends: every cut, forward and back, every micro-batch, and the shared parameters' gradients
    # once, over each stage mesh's devices
    column = sum(forward + backward for forward, backward in (s["send_bytes"] for s in pipeline["stages"]))
    exchanged = sum(e["bytes"] * len(e["to_stages"]) for e in pipeline["exchanges"])
    assert bool(exchanged) == (case in TIED)
    assert bool(report["random_ops"]["ops"]) == (case in DROPOUT)
    if case == "gpt tied pp2 x tp2":
        said = "wte.weight: held on stages 0 and 1; its gradient sent from stage 0 once per step"
        assert said in summary(plan)
    devices = 4 // int(mesh.split("x")[0])
    sent = sum(r["sent_bytes"] for r in ran["ranks"])
    assert sent == (column * pipeline["microbatches"] + exchanged) * devices
    text = report_text(report)
    assert f"pipeline: {pipeline['schedule']}, {pipeline['microbatches']} micro-batches" in text
    assert "point-to-point bytes as planned; every rank's collectives (its stages') as planned" in text
    assert f"run by torch.distributed.pipelining: its PipelineStage under {ran['torch_schedule']}" in text


def test_a_pipeline_plan_made_before_its_stages_counted_collectives_runs_and_says_so(ranks, tmp_path) -> None:
    model, mesh, axis_names, fields = CASES["gpt gpipe"]
    plan = pipeline_plan(model, mesh, axis_names, **fields)
    for stage in plan["pipeline"]["stages"]:
        del stage["collectives"], stage["comm_bytes"]
    report = run_checked(ranks, plan, model["model"], tmp_path / "plan.json", steps=1)
    assert report["collectives"]["match"] is None and report["pipeline"]["collectives_match"] is None
    assert report["collectives"]["measured"]  # counted all the same
    text = report_text(report)
    assert (
        "(the plan does not say its stages')" in text and "collectives (its stages') not in the plan" in text
    )


def test_the_runtimes_own_loop_makes_the_step_torchs_stages_make(ranks, tmp_path) -> None:
    """The fallback (a plan where nothing crosses a cut back) on a plan both can run: GPT-2 tied, whose head's
    contribution to the embedding's gradient goes beside torch's sends. The same loss, gradients and bytes."""
    model, mesh, axis_names, fields = CASES["gpt tied pp2 x tp2"]
    plan = pipeline_plan(model, mesh, axis_names, **fields)
    for rank, answer in enumerate(ranks.run(_both_runners, plan)):
        assert answer["schedule"] == "ScheduleInterleavedZeroBubble"
        assert answer["losses"][0] == answer["losses"][1], (rank, answer)
        assert answer["largest"] <= 1e-6 and answer["sent"][0] == answer["sent"][1] > 0, (rank, answer)


def _both_runners(plan: dict[str, Any]) -> dict[str, Any]:
    """One step of ``plan`` on torch's stages, one in the step's own loop, from the same weights."""
    import torch

    from runtime.apply import apply_plan
    from runtime.worker import device_mesh
    from strategies.models.builder import build_model

    torch.manual_seed(0)
    model = CASES["gpt tied pp2 x tp2"][0]
    sizes = {key: model[key] for key in ("batch", "seq", "layers")}
    spec = build_model(model["model"], dtype=torch.float32, device="cpu", **sizes, **model["options"])
    mesh = device_mesh("cpu", tuple(plan["mesh"]["shape"]), tuple(plan["mesh"]["axis_names"]))
    applied = apply_plan(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn)
    step, results, sent = applied.step, [], []
    schedule = step.torch_stages.schedule_name
    for runner in (step.torch_stages, None):
        step.torch_stages = runner
        results.append(applied.forward_backward(spec.example_inputs))
        sent.append(step.measured.sent_bytes)
    largest = max(
        float((results[0].gradients[n].full_tensor() - results[1].gradients[n].full_tensor()).abs().max())
        for n in results[0].gradients
    )
    losses = [float(result.loss.full_tensor()) for result in results]
    return {"schedule": schedule, "losses": losses, "largest": largest, "sent": sent}
