"""Pruning: a candidate whose bound proves it cannot beat the best so far stops, reported with that bound; the
results say whether the top row is proven best."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from service.search.candidates import Candidate
from service.search.executors import InlineExecutor
from service.search.pruning import BestSoFar, proof_text, top_row_proof
from service.search.runner import run_search, search_candidates
from strategies.plan.planner import PlanRequest, PrunedError, plan_model
from tests.service.search.conftest import mlp_search


def row(
    row_id: str, status: str, batch: int, rank: int | None = None, objective: float | None = None,
    bound: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    certificate = None if bound is None else {"status": status, "objective_s": objective, "bound_s": bound}
    planned = objective is not None
    return {"id": row_id, "status": status, "batch": batch, "seq": None, "rank": rank,
            "certificate": certificate, "samples_per_s": batch / objective if planned else None}  # fmt: skip


def test_the_cutoff_is_the_best_cost_per_token_so_far_times_the_candidates_tokens() -> None:
    best = BestSoFar()
    candidate = Candidate("c09", (2, 4), ("dp", "tp"), 64, 128)
    assert best.cutoff(candidate) is None
    best.seen(row("c00", "optimal", 32, objective=1.0, bound=1.0))  # 1/32 s per sample
    best.seen(row("c01", "infeasible", 16))
    best.seen(row("c02", "feasible", 16, objective=0.75, bound=0.7))  # 0.75/16: dearer per sample
    assert best.cutoff(candidate) == pytest.approx(64 * 128 / 32)
    near_ties_kept = BestSoFar(margin=0.01, per_token_s=best.per_token_s)
    assert near_ties_kept.cutoff(candidate) == pytest.approx(1.01 * 64 * 128 / 32)


def test_the_top_row_is_proven_best_when_no_other_bound_per_token_is_below_its_cost() -> None:
    rows = [
        row("c00", "optimal", 32, rank=1, objective=1.0, bound=1.0),
        row("c01", "feasible", 16, rank=2, objective=0.6, bound=0.55),  # 0.55/16 > 1/32
        row("c02", "pruned", 64, bound=2.5),
        row("c03", "infeasible", 64),
    ]
    proof = top_row_proof(rows)
    assert proof is not None and proof["top"] == "c00" and proof["proven"]
    assert (proof["below"], proof["unknown"], proof["closest"], proof["shortfall"]) == ([], [], None, 0.0)
    assert proof_text(proof).startswith("c00 is proven best")

    rows[1]["certificate"]["bound_s"] = 0.45  # 0.45/16 is 10% below 1/32
    rows.append(row("c04", "failed", 8))
    proof = top_row_proof(rows)
    assert proof is not None and not proof["proven"]
    assert proof["below"] == ["c01"] and proof["unknown"] == ["c04"] and proof["closest"] == "c01"
    assert proof["shortfall"] == pytest.approx(0.1)
    assert proof_text(proof) == (
        "c00 is not proven best: 1 candidates' bounds per token are below its cost, c01's the most, by "
        "10.00%; 1 without a bound (skipped, failed, or pipelines)"
    )
    assert top_row_proof([row("c03", "infeasible", 64)]) is None


def test_a_pipeline_on_top_is_never_proven_best_but_the_others_bounds_are_still_read() -> None:
    pipeline = {**row("c05", "feasible", 32, rank=1), "step_time_s": 1.0, "pipeline": {"schedule": "1f1b"}}
    rows = [pipeline, row("c01", "feasible", 16, rank=2, objective=0.6, bound=0.45)]  # 10% below 1/32
    proof = top_row_proof(rows)
    assert proof is not None and proof["top"] == "c05" and not proof["proven"] and proof["pipeline"]
    assert proof["below"] == ["c01"] and proof["shortfall"] == pytest.approx(0.1)
    assert proof_text(proof) == (
        "c05 is not proven best: a pipeline, its step simulated from a micro-batch plan: no bound of its "
        "own; 1 candidates' bounds per token are below its cost, c01's the most, by 10.00%"
    )
    rows[1]["certificate"]["bound_s"] = 0.55
    assert proof_text(top_row_proof(rows)) == (
        "c05 is not proven best: a pipeline, its step simulated from a micro-batch plan: no bound of its own"
    )


def test_a_plan_whose_bound_is_above_its_cutoff_is_not_made() -> None:
    request = PlanRequest(model="mlp", mesh="2x2", batch=256, options={"d": 256, "h": 1024}, gap=0.0)
    plan = plan_model(request).plan
    bound = plan["solver"]["bound"]
    with pytest.raises(PrunedError) as raised:
        plan_model(dataclasses.replace(request, cutoff_s=0.5 * bound))
    assert raised.value.bound_s == pytest.approx(bound) and raised.value.cutoff_s == 0.5 * bound
    # a cutoff above the bound changes nothing
    again = plan_model(dataclasses.replace(request, cutoff_s=2.0 * bound)).plan
    assert again["predicted"]["step_time_s"] == plan["predicted"]["step_time_s"]
    assert again["parameters"] == plan["parameters"]


def test_a_pruned_candidate_could_not_have_beaten_the_best(tmp_path: Path) -> None:
    # one at a time, batch 1024 first: its plans cost less per sample than batch 64's (the gradient reduction
    # is paid once per step), so the batch-64 candidates planned after them are pruned (and any batch-1024
    # one whose optimum is above the best before it)
    request = mlp_search(batch_sizes=[1024, 64], workers=1, prune=True)
    results = run_search(request, tmp_path, executor=InlineExecutor())
    rows = {r["id"]: r for r in results["candidates"]}
    pruned = [r for r in rows.values() if r["status"] == "pruned"]
    assert sum(r["batch"] == 64 for r in pruned) >= 2
    ranked = [r for r in rows.values() if r["rank"] is not None]
    best_per_sample = min(r["certificate"]["objective_s"] / r["batch"] for r in ranked)
    by_id = {c.id: c for c in search_candidates(request)}
    for r in pruned:
        assert r["plan_file"] is None and r["step_time_s"] is None
        batch = r["batch"]
        assert r["certificate"]["bound_s"] / batch > best_per_sample
        alone = plan_model(request.plan_request(by_id[r["id"]])).plan  # planned to the end, no cutoff
        assert alone["solver"]["objective"] >= r["certificate"]["bound_s"] * (1 - 1e-9)
        assert alone["solver"]["objective"] / batch > best_per_sample
    proof = results["proof"]
    assert proof is not None and proof["top"] == next(r["id"] for r in ranked if r["rank"] == 1)
    assert not set(proof["below"]) & {r["id"] for r in pruned}  # a pruned row's bound is above the best


def test_a_four_axis_search_plans_pipelines_as_planning_them_alone(tmp_path: Path) -> None:
    from service.search.request import SearchRequest

    tiny = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "ffn_dim": 128, "max_seq_len": 64}
    request = SearchRequest(
        model="llama3-8b", devices=16, batch_sizes=[8], seq=32, layers=4, options=tiny, dtype="float32",
        max_mesh_dims=4, workers=1, time_limit_s=30.0, gap=0.0,
    )  # fmt: skip
    results = run_search(request, tmp_path, executor=InlineExecutor())
    rows = {(tuple(r["mesh"]), ",".join(r["axis_names"])): r for r in results["candidates"]}
    pipelined = rows[((2, 2, 2, 2), "pp,dp,cp,tp")]
    assert pipelined["axis_names"] == ["pp", "dp", "cp", "tp"]
    assert pipelined["status"] in ("optimal", "feasible") and pipelined["rank"] is not None
    assert pipelined["pipeline"]["microbatches"] in (2, 4, 8) and pipelined["pipeline"]["bubble_s"] > 0
    # its certificate is its micro-batch plan's: no bound of the whole step, so no proof over it
    assert pipelined["certificate"]["bound_s"] is None and pipelined["id"] in results["proof"]["unknown"]
    candidate = next(c for c in search_candidates(request) if c.mesh == (2, 2, 2, 2))
    alone = plan_model(request.plan_request(candidate)).plan
    # the same micro-batch plan up to the solver's time limits: its regions stop on their limits, so a busy
    # machine (the suite's other process beside it) can end it on another plan within a fraction of a percent
    searched = json.loads((tmp_path / pipelined["plan_file"]).read_text())
    micro_s = searched["pipeline"]["microbatch"]["step_time_s"]
    assert micro_s == pytest.approx(alone["pipeline"]["microbatch"]["step_time_s"], rel=1e-2)
    # two micro-batch plans of one cost may split their backward differently between the activations'
    # gradients and the parameters' (a zero-bubble schedule's B and W), which moves the pipeline's step (3.1%
    # apart under load): so each step is checked as its own stages make it, the schedule replayed
    for plan in (searched, alone):
        replayed = _replayed_step(plan, request.hardware)
        assert plan["predicted"]["step_time_s"] == pytest.approx(replayed, rel=1e-9)
    assert pipelined["step_time_s"] == searched["predicted"]["step_time_s"]
    # pipelines without context parallelism beside the 3-D meshes (pp,dp,tp), the only others with stages
    assert {key for key, r in rows.items() if r["pipeline"] is not None} == {
        ((2, 2, 2, 2), "pp,dp,cp,tp"),
        *(((p, d, t), "pp,dp,tp") for p, d, t in ((2, 2, 4), (2, 4, 2), (4, 2, 2))),
    }
    # the report: the schedule under a pipeline's axes; its stages where it is shown as the winner
    from service.search.report.plan import winner_section
    from service.search.report.render import render_report

    shown = pipelined["pipeline"]
    assert f"{shown['schedule']}, {shown['microbatches']} micro-batches" in render_report(results, tmp_path)
    plan = json.loads((tmp_path / pipelined["plan_file"]).read_text())
    section = winner_section(pipelined, plan, None, "tokens/s")
    assert "Pipeline stages" in section
    assert section.count('<tr><td class="num">') == len(plan["pipeline"]["stages"])


def _replayed_step(plan: dict[str, Any], hardware: str) -> float:
    """The step of ``plan``'s pipeline replayed from its stages' seconds and sends alone: the schedule
    simulated over the link between stages, and the shared parameters' gradients exchanged after it."""
    from strategies.cost.hardware import get_hardware
    from strategies.plan.pipeline import ZERO_BUBBLE, Link, StageCost, simulate

    pipeline = plan["pipeline"]
    ranks = plan["mesh"]["shape"][0]
    devices = get_hardware(hardware)
    spans_nodes = math.prod(plan["mesh"]["shape"]) > devices.node_size
    between = devices.inter_node if spans_nodes else devices.intra_node
    link = Link(between.bandwidth, between.latency)
    split = pipeline["schedule"] == ZERO_BUBBLE  # its backward_s is B's, without the W after it
    costs = [
        StageCost(
            forward_s=stage["forward_s"],
            backward_s=stage["backward_s"] + (stage["weight_s"] if split else 0.0),
            send_bytes=stage["send_bytes"][0],
            gradient_bytes=stage["send_bytes"][1],
            weight_s=stage["weight_s"],
        )
        for stage in pipeline["stages"]
    ]
    hops = [link] * (len(costs) - 1)
    step = simulate(costs, pipeline["microbatches"], pipeline["schedule"], hops, len(costs) // ranks)
    exchanged = [link.seconds(x["bytes"]) * len(x["to_stages"]) for x in pipeline["exchanges"]]
    return step.step_s + max(exchanged, default=0.0)
