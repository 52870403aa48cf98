"""A search returns what planning each candidate alone returns, ranked by throughput; infeasible and failed
candidates are reported, not dropped; the files follow the results contract."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from service.search.budget import (
    FIRST_EXTRA_SHARE,
    MESH,
    PIPELINE,
    PRIOR_WEIGHT,
    RESULTS_RESERVE_S,
    BudgetShares,
)
from service.search.candidates import AXIS_ROLES, PIPELINE_WITHOUT_CP, Candidate
from service.search.executors import LocalPoolExecutor
from service.search.request import MIN_CANDIDATE_LIMIT_S, SearchRequest
from service.search.runner import dispatch_order, run_search, search_candidates
from service.search.screen import PipelineScreen
from service.search.task import FAILED, SKIPPED, CandidateTask
from solver.errors import InfeasibleError
from strategies.plan import planner
from strategies.plan.planner import PlanRequest, plan_model
from tests.service.search.conftest import gpt_search, mlp_search

ROW_FIELDS = {
    "id", "mesh", "axis_names", "batch", "seq", "status", "rank", "step_time_s", "compute_s", "comm_s",
    "exposed_comm_s", "contention_s", "load_s", "recompute_s", "recomputed", "samples_per_s", "tokens_per_s",
    "peak_memory_bytes", "memory_budget_bytes",
    "min_peak_bytes", "certificate", "plan_file", "error", "time_limit_s", "seconds", "pipeline",
}  # fmt: skip


def alone(request: SearchRequest) -> dict[str, dict[str, Any]]:
    """Each candidate planned by itself with plan_model (its own capture): id -> predicted and solver."""
    planned = {}
    for candidate in search_candidates(request):
        plan = plan_model(request.plan_request(candidate)).plan
        planned[candidate.id] = {
            "batch": candidate.batch,
            **plan["predicted"],
            "status": plan["solver"]["status"],
        }
    return planned


def expected_ranking(planned: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(
        planned,
        key=lambda i: (-planned[i]["batch"] / planned[i]["step_time_s"], planned[i]["peak_memory_bytes"], i),
    )


def assert_equal_to_alone(results: dict[str, Any], planned: dict[str, dict[str, Any]]) -> None:
    rows = {row["id"]: row for row in results["candidates"]}
    assert set(rows) == set(planned)
    for candidate_id, expected in planned.items():
        row = rows[candidate_id]
        assert row["status"] == expected["status"]
        assert row["step_time_s"] == pytest.approx(expected["step_time_s"], rel=1e-9)
        assert row["peak_memory_bytes"] == expected["peak_memory_bytes"]
    ranked = [row["id"] for row in results["candidates"] if row["rank"] is not None]
    assert ranked == expected_ranking(planned)
    assert [row["rank"] for row in results["candidates"]] == list(range(1, len(ranked) + 1))


def test_an_mlp_search_over_8_devices_ranks_as_planning_each_candidate_alone(mlp_results) -> None:
    request, results, _ = mlp_results
    assert len(results["candidates"]) == 8  # 8, 2x4, 4x2, 2x2x2 times two batches
    assert_equal_to_alone(results, alone(request))
    fastest = results["candidates"][0]
    assert fastest["samples_per_s"] == pytest.approx(fastest["batch"] / fastest["step_time_s"])
    assert fastest["tokens_per_s"] is None and fastest["seq"] is None  # an MLP has no sequence


def test_a_two_layer_gpt_search_ranks_as_planning_each_candidate_alone(tmp_path: Path) -> None:
    request = gpt_search()
    results = run_search(request, tmp_path)
    assert len(results["candidates"]) == 4
    assert_equal_to_alone(results, alone(request))
    for row in results["candidates"]:
        assert row["seq"] == 32
        assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * 32)


def test_the_results_files_follow_the_contract(mlp_results) -> None:
    _, results, out = mlp_results
    written = json.loads((out / "results.json").read_text())
    assert written == json.loads(json.dumps(results))
    assert written["format"] == "autoshard.search" and written["version"] == 1
    assert set(written["request"]) >= {
        "model", "devices", "hardware", "memory_gib", "batch_sizes", "seq", "max_mesh_dims", "executor",
        "workers", "time_limit_s",
    }  # fmt: skip
    assert isinstance(written["wall_s"], float) and written["wall_s"] > 0
    for row in written["candidates"]:
        assert set(row) == ROW_FIELDS
        assert row["status"] in ("optimal", "feasible")
        assert row["comm_s"] >= row["exposed_comm_s"] >= 0
        assert row["step_time_s"] == pytest.approx(
            row["compute_s"] + row["exposed_comm_s"] + row["contention_s"] + row["load_s"]
        )
        plan = json.loads((out / row["plan_file"]).read_text())
        assert row["certificate"]["bound_s"] <= plan["solver"]["objective"] * (1 + 1e-9)
        assert plan["mesh"]["shape"] == row["mesh"]
        profile = plan["predicted"]["memory_profile"]
        assert 0 < len(profile["bytes"]) <= 256
        assert max(profile["bytes"]) == plan["predicted"]["peak_memory_bytes"] == row["peak_memory_bytes"]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["id"] for r in rows] == [row["id"] for row in written["candidates"]]
    pareto = written["pareto"]
    assert pareto and pareto[0] == written["candidates"][0]["id"]
    by_id = {row["id"]: row for row in written["candidates"]}
    for front_id in pareto:  # nothing both faster and smaller
        front = by_id[front_id]
        assert not any(
            row["samples_per_s"] > front["samples_per_s"]
            and row["peak_memory_bytes"] < front["peak_memory_bytes"]
            for row in written["candidates"]
        )


def test_infeasible_candidates_are_reported_with_their_smallest_peak(tmp_path: Path) -> None:
    request = mlp_search(batch_sizes=[1024], memory_gib=0.001, workers=1)
    results = run_search(request, tmp_path)
    assert len(results["candidates"]) == 4
    for candidate, row in zip(search_candidates(request), results["candidates"], strict=True):
        assert row["status"] == "infeasible" and row["rank"] is None and row["plan_file"] is None
        with pytest.raises(InfeasibleError) as alone_error:
            plan_model(request.plan_request(candidate))
        assert row["min_peak_bytes"] == alone_error.value.min_peak
        assert row["min_peak_bytes"] > row["memory_budget_bytes"] == int(0.001 * 2**30)
        assert "smallest peak" in row["error"]
    assert results["pareto"] == []


def test_a_failing_candidate_is_reported_and_the_search_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = planner.plan_captured

    def fails_on_2x4(request, graph, repeat, progress=None, **options):
        if request.mesh == "2x4":
            raise RuntimeError("the 2x4 planner broke\nsecond line")
        return real(request, graph, repeat, progress, **options)

    monkeypatch.setattr(planner, "plan_captured", fails_on_2x4)
    results = run_search(mlp_search(batch_sizes=[64], workers=1), tmp_path)
    by_mesh = {tuple(row["mesh"]): row for row in results["candidates"]}
    assert by_mesh[(2, 4)]["status"] == "failed"
    assert by_mesh[(2, 4)]["error"] == "RuntimeError: the 2x4 planner broke"
    assert by_mesh[(2, 4)]["rank"] is None
    assert all(by_mesh[mesh]["rank"] is not None for mesh in ((8,), (4, 2), (2, 2, 2)))


def test_a_configuration_that_cannot_be_captured_fails_its_candidates_only(tmp_path: Path) -> None:
    results = run_search(mlp_search(options={"no_such_option": 1}, batch_sizes=[64], workers=1), tmp_path)
    assert {row["status"] for row in results["candidates"]} == {"failed"}
    assert all(row["error"].startswith("capture failed:") for row in results["candidates"])
    assert json.loads((tmp_path / "results.json").read_text())["candidates"]


def test_a_worker_process_that_dies_is_reported_and_the_search_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = planner.plan_captured

    def dies_on_2x2x2(request, graph, repeat, progress=None, **options):
        if request.mesh == "2x2x2":
            os._exit(3)  # the pool's workers are forked: they carry this patch
        return real(request, graph, repeat, progress, **options)

    monkeypatch.setattr(planner, "plan_captured", dies_on_2x2x2)
    # one worker: 2x2x2 (the first, most axes first) runs, 2x4 waits queued behind it, 4x2 and 8 wait here
    results = run_search(mlp_search(batch_sizes=[64], workers=1), tmp_path, executor=LocalPoolExecutor(1))
    assert len(results["candidates"]) == 4
    by_mesh = {tuple(row["mesh"]): row for row in results["candidates"]}
    assert by_mesh[(2, 2, 2)]["status"] == "failed"
    assert by_mesh[(2, 2, 2)]["error"].startswith("worker lost: BrokenProcessPool")
    # the task queued in the dead pool is lost with it; the rest go to a new pool and are planned
    assert by_mesh[(2, 4)]["status"] == "failed"
    assert by_mesh[(4, 2)]["status"] in ("optimal", "feasible") and by_mesh[(8,)]["status"] in (
        "optimal",
        "feasible",
    )
    assert json.loads((tmp_path / "results.json").read_text())["candidates"]


def test_each_candidate_solves_on_its_executors_share_of_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers on two cores: each candidate's solver gets one (two threads each would fork a second
    heuristic per solve onto the core the other worker needs)."""
    from service.search.executors import InlineExecutor

    real = planner.plan_captured
    threads_seen: list[int] = []

    def records_threads(request, graph, repeat, progress=None, threads=2):
        threads_seen.append(threads)
        return real(request, graph, repeat, progress, threads=threads)

    monkeypatch.setattr(planner, "plan_captured", records_threads)
    executor = InlineExecutor()
    executor.cores_per_task = 3
    run_search(mlp_search(batch_sizes=[64], workers=1), tmp_path, executor=executor)
    assert threads_seen == [3, 3, 3, 3]
    pool = LocalPoolExecutor(2)
    try:
        assert pool.cores_per_task == max(1, (os.cpu_count() or 1) // 2)
    finally:
        pool.close()


def test_a_budgets_even_share_is_what_plans_are_looked_up_at() -> None:
    request = SearchRequest(model="llama3-8b", devices=64, batch_sizes=[16, 32, 64], workers=2, budget_s=60.0)
    assert len(search_candidates(request)) == 48
    assert request.within_budget(48).time_limit_s == pytest.approx(0.8 * 60 * 2 / 48)  # 2 s each
    assert request.within_budget(4).time_limit_s == pytest.approx(24.0)
    assert request.within_budget(1) is request  # a 96 s share: the 60 s limit is the lower
    assert SearchRequest(model="mlp", devices=8, budget_s=1.0).within_budget(100).time_limit_s == 0.5
    unlimited = SearchRequest(model="mlp", devices=8, time_limit_s=3.0)
    assert unlimited.within_budget(1000) is unlimited
    with pytest.raises(ValueError, match="budget_s"):
        SearchRequest(model="mlp", devices=8, budget_s=0.0)


def test_candidates_are_planned_and_recorded_with_the_limit_each_was_given_from_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = planner.plan_captured
    limits: list[float] = []

    def records_limit(request, graph, repeat, progress=None, threads=2):
        limits.append(request.time_limit)
        return real(request, graph, repeat, progress, threads=threads)

    monkeypatch.setattr(planner, "plan_captured", records_limit)
    request = mlp_search(batch_sizes=[64], workers=1, budget_s=5.0, time_limit_s=30.0)
    candidates = len(search_candidates(request))
    results = run_search(request, tmp_path)
    # the first candidate's share of the budget (less the results' reserve and the capture before it), then
    # what is left as each starts: more once others ended early (an MLP's plans take a fraction of a second)
    assert len(limits) == candidates
    assert MIN_CANDIDATE_LIMIT_S <= limits[0] < 5.0 / candidates < limits[-1] < 5.0
    assert results["request"]["time_limit_s"] == 30.0 and results["request"]["budget_s"] == 5.0
    for row in results["candidates"]:
        plan = json.loads((tmp_path / row["plan_file"]).read_text())
        assert plan["request"]["time_limit"] == row["time_limit_s"]
    assert sorted(row["time_limit_s"] for row in results["candidates"]) == sorted(limits)
    assert results["wall_s"] < 5.0


def test_each_candidates_limit_is_its_share_of_the_time_left_when_it_starts() -> None:
    shares = BudgetShares(budget_s=60.0, candidates=48, workers=2, ceiling_s=60.0, started=0.0)
    left = 60.0 - RESULTS_RESERVE_S
    # 1.0 s in (the capture): 2 x 57.5 / 48 less a fifth of it for what a candidate costs beyond its limit
    first = shares.next_limit(now=1.0)
    assert first == pytest.approx(round((1 - FIRST_EXTRA_SHARE) * 2 * (left - 1.0) / 48, 2))
    second = shares.next_limit(now=1.0)  # the first counts as half done: the share is 2 x 57.5 / 47.5
    assert second == pytest.approx(round((1 - FIRST_EXTRA_SHARE) * 2 * (left - 1.0) / 47.5, 2))
    # the first ended early (0.5 s past its start, under its limit): no overrun, beside the prior's guess
    shares.finished(first, 0.5)
    share = 2 * (left - 1.5) / (46 + 0.5)
    guess = FIRST_EXTRA_SHARE * share
    assert shares.next_limit(now=1.5) == pytest.approx(round(share - PRIOR_WEIGHT * guess / 5, 2))
    # one ran 2 s past its limit: the mean overrun (with the guess) comes off every later share
    shares.finished(second, second + 2.0)
    share = 2 * (left - 4.0) / (45 + 0.5)
    extra = (2.0 + PRIOR_WEIGHT * FIRST_EXTRA_SHARE * share) / (2 + PRIOR_WEIGHT)
    assert shares.next_limit(now=4.0) == pytest.approx(round(share - extra, 2))
    # past the deadline: the least limit; never above the ceiling
    assert shares.next_limit(now=100.0) == MIN_CANDIDATE_LIMIT_S
    roomy = BudgetShares(budget_s=600.0, candidates=2, workers=2, ceiling_s=3.0, started=0.0)
    assert roomy.next_limit(now=0.0) == 3.0


def test_a_candidate_starts_only_if_its_kinds_overrun_fits_before_the_deadline() -> None:
    shares = BudgetShares(budget_s=100.0, candidates=4, workers=2, ceiling_s=60.0, started=0.0)
    deadline = 100.0 - RESULTS_RESERVE_S
    # nothing finished: any kind may start while the deadline has not passed
    assert shares.refusal(PIPELINE, now=deadline - 1.0) is None
    assert "budget was spent" in (shares.refusal(MESH, now=deadline) or "")
    # meshes ran 1 s past: a pipeline of 3 micro-batch plans, none finished yet, is expected 3 s past
    first = BudgetShares(budget_s=100.0, candidates=4, workers=2, ceiling_s=60.0, started=0.0)
    limit = first.next_limit(now=0.0)
    first.finished(limit, limit + 1.0)
    assert first.overrun_s(PIPELINE, plans=3) == pytest.approx(3.0)
    assert first.refusal(PIPELINE, now=deadline - 3.0, plans=3) is not None
    # pipelines ran 12 s past their limits, meshes 1 s: counted apart
    for kind, extra in ((PIPELINE, 10.0), (PIPELINE, 14.0), (MESH, 1.0)):
        limit = shares.next_limit(now=0.0, kind=kind)
        shares.finished(limit, limit + extra, kind)
    assert shares.overrun_s(PIPELINE) == pytest.approx(12.0) and shares.overrun_s(MESH) == pytest.approx(1.0)
    refusal = shares.refusal(PIPELINE, now=deadline - 10.0)
    assert refusal is not None and "pipeline candidate is expected to take 12.0 s past" in refusal
    assert shares.refusal(MESH, now=deadline - 10.0) is None
    # the last one waiting: its share (2 x 20 s) would run past the deadline; its limit leaves its kind's
    # overrun before it
    assert shares.next_limit(now=deadline - 20.0, kind=PIPELINE) == pytest.approx(8.0)
    assert shares.next_limit(now=deadline - 20.0, kind=MESH) == pytest.approx(19.0)
    # one passed over is neither waiting nor running: the shares of the rest grow
    before = BudgetShares(budget_s=100.0, candidates=10, workers=2, ceiling_s=60.0, started=0.0)
    after = BudgetShares(budget_s=100.0, candidates=10, workers=2, ceiling_s=60.0, started=0.0)
    after.passed_over()
    assert after.next_limit(now=0.0) > before.next_limit(now=0.0)


def test_pipelines_start_fewest_axes_then_fewest_stages_first_then_by_their_twins_step() -> None:
    pipelines = [
        Candidate("a", (4, 2, 2, 2), AXIS_ROLES[4], 64, None),
        Candidate("b", (2, 4, 2, 2), AXIS_ROLES[4], 64, None),
        Candidate("c", (2, 2, 4, 2), AXIS_ROLES[4], 64, None),
        Candidate("d", (2, 2, 2, 4), AXIS_ROLES[4], 64, None),
        Candidate("e", (8, 2, 2), PIPELINE_WITHOUT_CP, 64, None),
    ]
    mesh = Candidate("m", (4, 4, 2), AXIS_ROLES[3], 32, None)
    screen = PipelineScreen()
    for twin_mesh, step in (((8, 2, 2), 3.0), ((4, 4, 2), 2.0), ((16, 2, 2), 1.0)):
        screen.seen({"mesh": list(twin_mesh), "axis_names": list(AXIS_ROLES[3]), "batch": 64,
                     "step_time_s": step, "pipeline": None})  # fmt: skip
    screen.seen(
        {
            "mesh": [2, 2, 2, 4],
            "axis_names": list(AXIS_ROLES[4]),
            "batch": 64,
            "step_time_s": 0.1,
            "pipeline": {},
        }
    )  # fmt: skip  (a pipeline is no twin)
    assert screen.twin_step(pipelines[2]) == (2.0, "dp,cp,tp 4x4x2")
    pending = [*pipelines, mesh]
    order = [screen.take_next(pending).id for _ in range(6)]
    # a pipeline of 3 axes first, whatever its stages (e: pp,dp,tp 8x2x2); then 2 stages: c (twin 4x4x2,
    # 2.0 s), b (8x2x2, 3.0 s), d (4x2x4: no plan); then 4 stages (a, whose twin 16x2x2 is the fastest); the
    # mesh of a smaller batch after every pipeline of 64
    assert order == ["e", "c", "b", "d", "a", "m"]


def sleeping_plan(task: CandidateTask, graph: dict[str, Any]) -> dict[str, Any]:
    time.sleep(60)
    return {"id": task.candidate_id, "status": "optimal", "seconds": 60.0}


def test_the_budgets_end_stops_the_candidates_still_planning() -> None:
    pool = LocalPoolExecutor(2, plan=sleeping_plan)
    request = PlanRequest(model="mlp", mesh="2", batch=8)
    work = ((CandidateTask(f"c{k:02d}", request, "no-such-graph", 1), {}) for k in range(4))
    started = time.perf_counter()
    try:
        outcomes = list(pool.run(work, deadline=started + 1.0))
    finally:
        pool.close()
    # not a minute each: at the deadline the three handed over (two running, one queued) are stopped with
    # their workers, and the one handed over after it too
    elapsed = time.perf_counter() - started
    assert 1.0 <= elapsed < 20.0
    assert [o["id"] for o in outcomes] == ["c00", "c01", "c02", "c03"]
    assert all(o["status"] == SKIPPED and "stopped at the budget's end" in o["error"] for o in outcomes)
    # each counted from its hand-over (just after `started`) to the deadline
    assert all(0.0 < o["seconds"] <= elapsed for o in outcomes[:3])


def test_the_pool_takes_tasks_as_its_workers_free_up() -> None:
    # all running and one queued: the runner sets each task's limit with the outcomes before it in hand
    pulled: list[int] = []
    seen_before_pull: list[int] = []
    outcomes: list[dict[str, Any]] = []

    def work():
        for k in range(6):
            pulled.append(k)
            seen_before_pull.append(len(outcomes))
            request = PlanRequest(model="mlp", mesh="2", batch=8)
            yield CandidateTask(f"c{k:02d}", request, "no-such-graph", 1), {}

    pool = LocalPoolExecutor(2)
    try:
        for outcome in pool.run(work()):
            outcomes.append(outcome)
    finally:
        pool.close()
    assert len(outcomes) == 6 and all(o["status"] == FAILED for o in outcomes)
    assert seen_before_pull[:3] == [0, 0, 0]  # two running, one queued
    assert all(seen >= k - 2 for k, seen in enumerate(seen_before_pull))


def test_once_the_budget_is_spent_no_candidate_starts(tmp_path: Path) -> None:
    # a 1 s budget is spent before the first candidate (the results' reserve alone is 1.5 s): every row says
    # so, none is dropped, the files are written
    results = run_search(mlp_search(batch_sizes=[64], workers=1, budget_s=1.0), tmp_path)
    assert [row["status"] for row in results["candidates"]] == ["skipped"] * 4
    assert all("budget was spent before it could start" in row["error"] for row in results["candidates"])
    assert results["proof"] is None and (tmp_path / "results.json").exists()
    shares = BudgetShares(budget_s=10.0, candidates=4, workers=1, ceiling_s=5.0, started=0.0)
    deadline = 10.0 - RESULTS_RESERVE_S
    assert not shares.spent(now=deadline - 0.01) and shares.spent(now=deadline)


def test_the_largest_batch_starts_first_and_pipelines_after_the_meshes_without() -> None:
    request = SearchRequest(model="mlp", devices=16, batch_sizes=[16, 64], max_mesh_dims=4)
    order = dispatch_order(search_candidates(request))
    assert [c.batch for c in order] == sorted((c.batch for c in order), reverse=True)
    at_64 = [c for c in order if c.batch == 64]
    pipelined = [c.axis_names[0] == "pp" for c in at_64]
    assert pipelined == sorted(pipelined) and any(pipelined)  # every pipeline after every other mesh
    others = [len(c.mesh) for c in at_64 if c.axis_names[0] != "pp"]
    assert others == sorted(others, reverse=True)
