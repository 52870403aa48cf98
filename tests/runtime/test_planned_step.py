"""Plans run on 4 gloo ranks as planned: the solver's plan for an MLP, a 2-layer GPT with attention, a 2-layer
`transformers` Llama (a factory) and a 6-layer llama3 planned from a 4-layer capture (run at its full depth),
on meshes (4,) and (2, 2), and every hand-written baseline of the GPT on (2, 2).

Each run checks itself (`run_rank` with ``check``): the loss and every gradient of step 0 equal one process,
and so does every parameter after two optimizer steps. Here the test asserts that the check ran, that every
op came out in its planned placements, and that the collectives DTensor ran are the plan's, kind and count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.launch import check_before_start
from runtime.plan_checks import PlanMismatch, check_plan
from runtime.worker import RunOptions, run_rank
from strategies.plan.planner import PlanRequest, plan_model
from tests.gloo_ranks import RankError

USER_MODELS = Path(__file__).resolve().parents[1] / "strategies" / "models" / "user_models"
HF_LLAMA = f"{USER_MODELS / 'hf_llama.py'}:factory"
GPT = {"dim": 128, "n_heads": 4, "vocab_size": 256, "max_seq_len": 64, "ffn_dim": 512}
LLAMA = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "ffn_dim": 128, "max_seq_len": 64}

MODELS = {
    # name -> (model, request fields); float32 so one process is a sharp reference
    "mlp": ("mlp", {"batch": 64, "options": {"d": 256, "h": 1024}}),
    "gpt": ("gpt2-small", {"batch": 8, "seq": 32, "layers": 2, "options": GPT}),
    "llama": (HF_LLAMA, {}),
    # 6 layers planned from a capture of 4 (first, two tied middle copies, last): run at full depth
    "deep": ("llama3-8b", {"batch": 4, "seq": 16, "layers": 6, "options": LLAMA}),
}
LAYOUTS = (None, "ddp", "fsdp", "megatron", "fsdp_tp")
#: Full depth from a short capture: the program's own plan on a line of 4, and a 2-D layout that gathers,
#: reduces and cuts matmuls on both axes (each case ~12 s of the suite; the other layouts at full depth add
#: no path of their own).
DEEP_CASES = {
    ("deep", "4", None),
    ("deep", "2x2", "fsdp_tp"),
}
#: The hand-written layouts run here on the 2-layer GPT on the 2x2 mesh only (two steps, the bytes of every
#: collective): tests/runtime/test_every_plan_runs.py runs every baseline of every built-in model on both
#: meshes; here each model's own plan runs on both.
LAYOUT_MODELS = ("gpt",)
CASES = [
    (name, mesh, layout)
    for name in MODELS
    for mesh in ("4", "2x2")
    for layout in LAYOUTS
    if (name, mesh, layout) in DEEP_CASES
    or (name != "deep" and (layout is None or (mesh == "2x2" and name in LAYOUT_MODELS)))
]


def write_plan(tmp: Path, name: str, mesh: str, layout: str | None) -> Path:
    model, fields = MODELS[name]
    request = PlanRequest(model=model, mesh=mesh, dtype="float32", baseline=layout, time_limit=30, **fields)
    path = tmp / f"{name}-{mesh}-{layout or 'plan'}.json"
    path.write_text(json.dumps(plan_model(request).plan), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("name", "mesh", "layout"), CASES, ids=[f"{n}-{m}-{lay or 'plan'}" for n, m, lay in CASES]
)
def test_the_plan_runs_as_planned_and_equals_one_process(ranks, tmp_path, name, mesh, layout) -> None:
    plan = write_plan(tmp_path, name, mesh, layout)
    reports = ranks.run(
        run_rank, RunOptions(model=MODELS[name][0], plan=str(plan), steps=2, lr=1e-3, check=True)
    )
    for rank, report in enumerate(reports):
        assert isinstance(report, dict), f"rank {rank}: {report}"
    report = reports[0]
    assert report["checked"] and len(report["loss"]) == 2
    assert report["deviations"] == []
    collectives = report["collectives"]
    assert collectives["measured"] == collectives["expected_on_backend"], collectives
    if "all_to_all" not in collectives["predicted"]:  # gloo gathers instead: other bytes
        assert collectives["measured_bytes"] == collectives["predicted_bytes"], collectives
    if layout in ("ddp", "fsdp"):  # data parallel: gradients are reduced
        assert sum(collectives["measured"].values()) > 0
    assert all(r["loss"] == report["loss"] for r in reports)
    memory = report["memory"]  # the plan's memory promise holds: no rank above its predicted peak
    assert 0 < max(memory["peak_bytes_per_rank"]) <= 1.1 * memory["predicted_peak_bytes"], memory
    if name == "deep":
        assert json.loads(plan.read_text())["layers"] == {"captured": 4, "total": 6}


def test_a_plan_for_another_model_is_refused_by_name(ranks, tmp_path) -> None:
    plan = write_plan(tmp_path, "mlp", "4", None)
    reports = ranks.run(run_rank, RunOptions(model="gpt2-small", plan=str(plan)))
    assert all(
        isinstance(r, RankError) and r.message.startswith("PlanMismatch: model: the plan was made for mlp")
        for r in reports
    )


def test_a_plan_for_another_mesh_version_or_world_size_is_refused(tmp_path) -> None:
    path = write_plan(tmp_path, "mlp", "2x2", None)
    plan = json.loads(path.read_text())
    with pytest.raises(PlanMismatch, match=r"mesh: the plan is for a mesh of shape \[2, 2\], not \[4\]"):
        check_plan(plan, (4,))
    with pytest.raises(PlanMismatch, match="needs 4 ranks, this run has 2"):
        check_before_start(RunOptions(model="mlp", plan=str(path)), nproc=2)
    path.write_text(json.dumps({**plan, "version": 7}))
    with pytest.raises(PlanMismatch, match="plan: version 7 is not one this runtime knows"):
        check_before_start(RunOptions(model="mlp", plan=str(path)), nproc=4)
    with pytest.raises(PlanMismatch, match="no plan file"):
        check_before_start(RunOptions(model="mlp", plan=str(tmp_path / "none.json")), nproc=4)


def test_a_plan_naming_other_parameters_is_refused(ranks, tmp_path) -> None:
    path = write_plan(tmp_path, "mlp", "4", None)
    plan = json.loads(path.read_text())
    plan["parameters"]["w3.weight"] = plan["parameters"].pop("w2.weight")
    path.write_text(json.dumps(plan))
    reports = ranks.run(run_rank, RunOptions(model="mlp", plan=str(path)))
    assert all(
        isinstance(r, RankError) and "w2.weight" in r.message and "w3.weight" in r.message for r in reports
    )


def test_a_vocabulary_parallel_lookup_runs_again_on_other_tokens(ranks, tmp_path) -> None:
    """The lookup's P(mask) output shares its mask buffer with every later lookup of the same shapes and
    placements (DTensor's propagator hands out one placement object): once the value goes, its mask must go
    too, or the next run's tokens meet the last run's mask ("MaskBuffer has been materialized with
    conflicting data")."""
    plan = write_plan(tmp_path, "gpt", "2x2", "megatron")
    embedding = next(n for n in json.loads(plan.read_text())["nodes"] if n["op"] == "aten.embedding.default")
    assert "P(mask)" in embedding["output"][0]  # the vocabulary cut over tp
    for seed in (3, 4):  # other weights and other tokens, in the same processes
        reports = ranks.run(run_rank, RunOptions(model="gpt2-small", plan=str(plan), steps=1, seed=seed))
        assert all(isinstance(r, dict) for r in reports), reports
