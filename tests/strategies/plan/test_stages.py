"""A plan split by layer, and plans with a pipeline axis: stages, micro-batches, schedule, the runtime's
refusal."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from runtime.plan_checks import PlanMismatch, check_plan, run_mesh
from service.plan_view import summary
from strategies.plan.pipeline import GPIPE, INTERLEAVED, ONE_F_ONE_B, ZERO_BUBBLE, Link
from strategies.plan.planner import PlanOutcome, PlanRequest, plan_model
from strategies.plan.stages import layer_profile, predict_pipeline

LLAMA = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "ffn_dim": 128, "max_seq_len": 64}


def small_llama(**fields: Any) -> PlanRequest:
    values: dict[str, Any] = {
        "model": "llama3-8b", "mesh": "2", "batch": 8, "seq": 32, "layers": 6, "dtype": "float32",
        "options": LLAMA, "gap": 0.0, "time_limit": 30,
    }  # fmt: skip
    return PlanRequest(**{**values, **fields})


@pytest.fixture(scope="module")
def repeated() -> PlanOutcome:
    """Six layers captured as four (first, two tied middle copies, last)."""
    return plan_model(small_llama())


def profile_of(outcome: PlanOutcome):
    chosen = np.asarray(outcome.result.solution, dtype=np.int64)
    return layer_profile(outcome.built, chosen, outcome.plan["predicted"]["step_time_s"])


@pytest.mark.parametrize("captured", [4, None])
def test_the_layers_split_the_plans_step_and_the_head_sits_outside_them(
    repeated: PlanOutcome, captured: int | None
) -> None:
    outcome = repeated if captured == 4 else plan_model(small_llama(captured_layers=None))
    profile = profile_of(outcome)
    assert len(profile.layers) == 6
    parts = [*profile.layers, profile.first, profile.last]
    step = outcome.plan["predicted"]["step_time_s"]
    assert sum(p.forward_s + p.backward_s for p in parts) == pytest.approx(step, rel=1e-9)
    # identical layers cost alike (the first and last layer too: the head and the loss are not theirs)
    middle = profile.layers[1]
    for layer in profile.layers:
        assert layer.forward_s == pytest.approx(middle.forward_s, rel=0.1)
        assert layer.backward_s == pytest.approx(middle.backward_s, rel=0.1)
        assert layer.parameter_bytes == profile.layers[0].parameter_bytes > 0
        assert layer.activation_bytes > 0
    assert profile.first.parameter_bytes > 0  # the embedding
    assert profile.last.forward_s > 0 and profile.last.backward_s > 0  # the head and the loss
    # over a cut: the residual stream of the micro-batch as the plan holds it (whole or split over the two
    # devices) and the rotary table every layer reads, forward; the stream's gradient, backward
    (forward, backward), *_ = profile.cut_bytes([range(0, 3), range(3, 6)])
    assert backward in (8 * 32 * 64 * 4, 8 * 32 * 64 * 4 / 2)
    assert backward < forward <= backward + 32 * 64 * 4
    assert profile.cut_bytes([range(0, 2), range(2, 4), range(4, 6)]) == [(forward, backward)] * 2


def test_one_stage_of_one_micro_batch_is_the_plan_itself(repeated: PlanOutcome) -> None:
    profile = profile_of(repeated)
    whole = predict_pipeline(profile, 1, 1, ONE_F_ONE_B, Link(1e9))
    assert whole.step_s == pytest.approx(repeated.plan["predicted"]["step_time_s"], rel=1e-9)
    assert whole.bubble_s == (pytest.approx(0.0),) and whole.stages == (range(0, 6),)
    assert whole.send_bytes == 0.0


def test_stages_cut_every_layer_once_and_1f1b_holds_less_than_gpipe(repeated: PlanOutcome) -> None:
    profile = profile_of(repeated)
    one_f_one_b = predict_pipeline(profile, 3, 6, ONE_F_ONE_B, Link(1e9, 1e-5))
    gpipe = predict_pipeline(profile, 3, 6, GPIPE, Link(1e9, 1e-5))
    assert [layer for stage in one_f_one_b.stages for layer in stage] == list(range(6))
    assert one_f_one_b.peak_bytes[0] < gpipe.peak_bytes[0]
    # two cuts, each crossed forward and back by each of the 6 micro-batches
    cuts = profile.cut_bytes(list(one_f_one_b.stages))
    assert len(cuts) == 2 and one_f_one_b.cut_bytes == tuple(cuts)
    assert one_f_one_b.send_bytes == pytest.approx(6 * sum(forward + backward for forward, backward in cuts))
    assert all(bubble > 0 for bubble in one_f_one_b.bubble_s)


def test_the_backward_splits_into_activations_and_parameters_gradients_for_zero_bubble(
    repeated: PlanOutcome,
) -> None:
    built = repeated.built
    weight_ops, group = built.weight_ops, built.op_group
    assert weight_ops and group is not None
    nodes = built.nodes
    for edge in built.edges:
        producer, consumer = nodes[edge.producer], nodes[edge.consumer]
        if producer.kind == "op" and producer.name in weight_ops and consumer.kind == "op":
            # a W op's result stays in its layer, read by W ops only: B never waits for W
            assert consumer.name in weight_ops and group[consumer.name] == group[producer.name]
        if consumer.kind == "gradient" and ".layers." in f".{consumer.name}" and producer.kind == "op":
            assert producer.name in weight_ops, consumer.name  # every layer's parameters' gradients are W
    profile = profile_of(repeated)
    for layer in profile.layers:
        assert 0 < layer.weight_s < layer.backward_s
        assert layer.weight_bytes > 0
    link = Link(1e9, 1e-5)
    zero_bubble = predict_pipeline(profile, 3, 6, ZERO_BUBBLE, link)
    one_f_one_b = predict_pipeline(profile, 3, 6, ONE_F_ONE_B, link)
    assert zero_bubble.stages == one_f_one_b.stages
    assert zero_bubble.step_s < one_f_one_b.step_s
    assert max(zero_bubble.bubble_s) < min(one_f_one_b.bubble_s)


def test_a_stage_counts_its_share_of_every_parameters_memory(repeated: PlanOutcome) -> None:
    half = plan_model(small_llama(parameter_memory_share=0.5))
    kinds = ("parameter", "gradient")
    whole = [n for n in repeated.built.nodes if n.kind in kinds]
    shared = [n for n in half.built.nodes if n.kind in kinds]
    assert len(whole) == len(shared) > 0
    for full, stage in zip(whole, shared, strict=True):
        assert np.array_equal(stage.memory_bytes, np.ceil(full.memory_bytes * 0.5).astype(np.int64))
    # the layers' own bytes are the whole parameters' again
    assert profile_of(half).layers[1].parameter_bytes == pytest.approx(
        profile_of(repeated).layers[1].parameter_bytes, rel=1e-3
    )


def test_a_tied_parameter_is_held_on_both_ranks_and_its_gradient_sent_once_per_step() -> None:
    gpt = {"dim": 64, "n_heads": 4, "vocab_size": 256, "max_seq_len": 64, "ffn_dim": 128}
    tied, untied = (
        plan_model(small_llama(model="gpt2-small", layers=4, options={**gpt, "tie_embeddings": tie}))
        for tie in (True, False)
    )
    shared = profile_of(tied).shared
    assert [p.name for p in shared] == ["wte.weight"] and not profile_of(untied).shared
    weight = shared[0]
    assert weight.parameter_bytes > weight.gradient_bytes == 256 * 64 * 4  # float32, one device
    assert {str(group) for group in weight.groups} == {"first", "last"} and str(weight.maker) == "first"
    link = Link(1e9, 1e-5)
    with_tie, without = (predict_pipeline(profile_of(o), 2, 4, ONE_F_ONE_B, link) for o in (tied, untied))
    (exchange,) = with_tie.exchanges
    assert (exchange.name, exchange.from_stage, exchange.to_stages) == ("wte.weight", 0, (1,))
    assert exchange.nbytes == weight.gradient_bytes and not without.exchanges
    # the last stage holds the weight (with its optimizer state) and the gradient it receives; the step waits
    # for the send; the head's contributions to the gradient cross the cut back every micro-batch
    cuts = profile_of(tied).cut_bytes(list(with_tie.stages))
    assert with_tie.send_bytes == pytest.approx(4 * sum(f + b for f, b in cuts) + exchange.nbytes)
    assert with_tie.step_s >= link.seconds(exchange.nbytes)
    assert cuts[0][1] >= profile_of(untied).cut_bytes(list(with_tie.stages))[0][1] + 256 * 64 * 4 / 2


@pytest.fixture(scope="module")
def pipelined() -> PlanOutcome:
    return plan_model(small_llama(mesh="2x2", axis_names="pp,dp"))


def test_a_pp_axis_plans_stages_of_the_plan_on_the_other_axes(pipelined: PlanOutcome) -> None:
    plan = pipelined.plan
    pipeline = plan["pipeline"]
    assert plan["mesh"]["shape"] == [2, 2] and plan["mesh"]["axis_names"] == ["pp", "dp"]
    assert pipeline["axis"] == "pp" and pipeline["schedule"] in (ONE_F_ONE_B, ZERO_BUBBLE, INTERLEAVED, GPIPE)
    assert pipeline["microbatches"] in (2, 4, 8)
    assert pipeline["microbatch_size"] * pipeline["microbatches"] == 8
    stages, chunks = pipeline["stages"], pipeline["chunks"]
    assert [s["ranks"] for s in stages] == [[0, 2], [2, 4]] * chunks  # stage k on rank group k mod 2
    bounds = [s["layers"] for s in stages]
    assert bounds[0][0] == 0 and bounds[-1][1] == 6
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in pairwise(bounds))
    predicted = plan["predicted"]
    assert predicted["peak_memory_bytes"] == max(s["peak_memory_bytes"] for s in stages)
    assert predicted["bubble_s"] == max(s["bubble_s"] for s in stages) > 0
    assert predicted["step_time_s"] > pipeline["microbatch"]["step_time_s"]
    # each stage's seconds per micro-batch, its W apart only under zero-bubble; each rank's stages' work over
    # the micro-batches is the step less its bubble
    zero_bubble = pipeline["schedule"] == ZERO_BUBBLE
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in stages)
    assert all((s["weight_s"] > 0) == zero_bubble for s in stages)
    busy = [
        sum(s["forward_s"] + s["backward_s"] + s["weight_s"] for s in stages[rank::2])
        * pipeline["microbatches"]
        for rank in (0, 1)
    ]
    for rank in (0, 1):
        assert busy[rank] == pytest.approx(predicted["step_time_s"] - stages[rank]["bubble_s"], rel=1e-6)
    assert all(len(spec) == 1 for spec in plan["parameters"].values())  # placements over dp, after pp
    assert plan["request"]["axis_names"] == "pp,dp"
    assert pipelined.built.parameter_memory_share == 0.5  # a stage holds half the layers
    text = summary(plan)
    assert f"along pp, {pipeline['schedule']}, {pipeline['microbatches']} micro-batches" in text
    assert f"  stage {len(stages) - 1}: layers" in text


def test_a_pipeline_plan_runs_on_its_pp_axis_and_its_stages_mesh(pipelined: PlanOutcome) -> None:
    plan = pipelined.plan
    assert plan["pipeline"]["stage_mesh"] == {"shape": [2], "axis_names": ["dp"]}
    check_plan(plan, (2, 2))
    assert run_mesh(plan) == ((2, 2), ("pp", "dp"))
    with pytest.raises(PlanMismatch, match=r"mesh: the plan is for a mesh of shape \[2, 2\], not \[4\]"):
        check_plan(plan, (4,))
    # a pp-only mesh: each stage on one device
    alone = {"shape": [1], "axis_names": ["dp"]}
    pp_only = {
        **plan,
        "mesh": {"shape": [4], "axis_names": ["pp"]},
        "pipeline": {"axis": "pp", "stage_mesh": alone},
    }
    assert run_mesh(pp_only) == ((4, 1), ("pp", "dp"))


def test_interleaving_stages_on_each_rank_group_shrinks_the_bubble(repeated: PlanOutcome) -> None:
    profile = profile_of(repeated)
    plain = predict_pipeline(profile, 2, 4, ONE_F_ONE_B, Link(1e9, 1e-5))
    interleaved = predict_pipeline(profile, 2, 4, INTERLEAVED, Link(1e9, 1e-5), chunks=3)
    assert len(interleaved.stages) == 6 and len(interleaved.bubble_s) == 2
    assert [layer for stage in interleaved.stages for layer in stage] == list(range(6))
    assert max(interleaved.bubble_s) < max(plain.bubble_s)
    assert interleaved.step_s < plain.step_s


def test_an_interleaved_plan_puts_several_stages_on_each_rank_group() -> None:
    plan = plan_model(small_llama(mesh="2x2", axis_names="pp,dp", schedule=INTERLEAVED)).plan
    pipeline = plan["pipeline"]
    # 2 stages per rank group: 4 would leave 8 stages for 6 layers
    assert pipeline["schedule"] == INTERLEAVED and pipeline["chunks"] == 2
    stages = pipeline["stages"]
    assert len(stages) == 2 * pipeline["chunks"]
    assert [s["ranks"] for s in stages] == [[0, 2], [2, 4]] * pipeline["chunks"]
    assert "stages (2 per rank group) along pp, interleaved-1f1b" in summary(plan)


def test_an_interleaved_schedule_the_layers_cannot_fill_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="4 ranks need 8 layers and the model has 6, with 4 micro-batches"):
        plan_model(small_llama(mesh="4", axis_names="pp", schedule=INTERLEAVED, microbatches=4))


def test_an_asked_micro_batch_count_and_schedule_are_kept() -> None:
    plan = plan_model(small_llama(mesh="2x2", axis_names="pp,dp", microbatches=4, schedule=GPIPE)).plan
    assert (plan["pipeline"]["microbatches"], plan["pipeline"]["schedule"]) == (4, GPIPE)


def test_a_micro_batch_size_no_plan_fits_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    import strategies.plan.planner as planner
    from solver.errors import InfeasibleError

    real = planner.plan_model

    def nothing_fits_a_micro_batch_of_four(request, progress=None):
        if request.mesh == "2" and request.batch == 4:
            raise InfeasibleError("no plan fits", min_peak=2**40)
        return real(request, progress)

    monkeypatch.setattr(planner, "plan_model", nothing_fits_a_micro_batch_of_four)
    plan = real(small_llama(mesh="2x2", axis_names="pp,dp")).plan
    assert plan["pipeline"]["microbatches"] in (4, 8)  # not 2 (micro-batches of 4)
    with pytest.raises(InfeasibleError, match="pipeline: no micro-batch count"):
        real(small_llama(mesh="2x2", axis_names="pp,dp", microbatches=2))


def test_a_faster_schedule_over_the_memory_is_fitted_by_planning_the_micro_batch_within_less() -> None:
    # 2 micro-batches within 7 MB: 1F1B fits (7.92 ms), zero-bubble with 2 stages per rank holds 7.33 MB as
    # first planned (5.68 ms); planned again within less, a faster schedule than 1F1B fits
    limit = 7.0e6
    request = small_llama(mesh="2x2", axis_names="pp,dp", microbatches=2, memory_gib=limit / 2**30)
    said: list[str] = []
    plan = plan_model(request, said.append).plan
    one_f_one_b = plan_model(dataclasses.replace(request, schedule=ONE_F_ONE_B)).plan
    assert any("the micro-batch plan again within" in line for line in said), said
    assert plan["pipeline"]["schedule"] != ONE_F_ONE_B
    assert plan["predicted"]["peak_memory_bytes"] <= limit
    assert plan["predicted"]["step_time_s"] < 0.9 * one_f_one_b["predicted"]["step_time_s"]
    assert plan["request"]["memory_gib"] == request.memory_gib  # the request's, not the tighter plan's


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mesh": "2x2", "axis_names": "dp,pp"}, "the pipeline axis pp must come first"),
        ({"mesh": "2x2", "axis_names": "pp,dp", "microbatches": 3}, "microbatches: 3 does not divide"),
        ({"mesh": "2x2", "axis_names": "pp,dp", "schedule": "zb"}, "schedule: 'zb'"),
        ({"mesh": "2x2", "axis_names": "pp,dp", "batch": 3}, "batch: 3 is not a multiple of the 2 stages"),
        ({"mesh": "2x2", "axis_names": "pp,dp", "baseline": "fsdp"}, "no pipeline axis"),
        ({"mesh": "2", "microbatches": 2}, "only for a pipeline"),
    ],
)
def test_bad_pipeline_requests_are_refused_before_any_work(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_model(dataclasses.replace(small_llama(), **fields))
