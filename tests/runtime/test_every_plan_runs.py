"""Every plan the planner writes runs on 4 gloo ranks and equals one process (issue 24).

- Every hand-written baseline (ddp, fsdp, megatron, fsdp_tp) of every built-in model (mlp, gpt2-small,
  llama3-8b, moe; one layer, tiny widths) on meshes (4,) and (2, 2): each model is captured once, each plan
  is built from that capture, and one job per model and mesh runs every plan's step (a
  :class:`~runtime.planned_step.PlannedStep` on one capture) against one process. A baseline the mesh
  cannot hold (fsdp_tp on one axis) is refused by the planner in one line.
- FSDP of llama3-8b with a vocabulary large enough that the embedding is looked up row-wise: its output is
  ``P(mask)`` (DTensor's ``_MaskPartial``), which the runtime takes as the output it is.
- T5's ``aten.fill_.Tensor`` has no DTensor rule: the plan replicates it and the runtime runs it on the
  local replicas, in place.
- Sliding-window Mistral's ``new_ones`` (transformers' ``and_masks``) reads its source on no axis: the plan
  writes ``["R", "*"]`` and the runtime passes the source as it is.
- A plan the runtime cannot read is the plan's fault, said so; an op that fails says which, where, and what
  to do, in one line.

Dropout is off in these models: sharded dropout is tested on its own.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.launch import ERROR_MARK, _ExpectedFailures
from runtime.plan_checks import PlanMismatch, check_shapes, node_plans
from runtime.plan_specs import differs, read_placements
from runtime.worker import RunOptions, run_rank
from strategies.graph.capture import JointGraph
from strategies.placement import NONE, R, parse_spec
from strategies.plan.baselines import BASELINES
from strategies.plan.planner import PlanRequest, capture_request, plan_captured, plan_model
from tests.gloo_ranks import RankError

HERE = Path(__file__).resolve().parent
ZOO = HERE.parent / "strategies" / "models" / "user_models" / "zoo.py"
T5 = f"{HERE / 'dropout_free.py'}:t5"
SLIDING_WINDOW = f"{ZOO}:mistral_sliding_window"

LLAMA = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128, "max_seq_len": 32}
MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"batch": 16, "options": {"d": 64, "h": 128}},
    "gpt2-small": {
        "batch": 4,
        "seq": 16,
        "layers": 1,
        "options": {"dim": 64, "n_heads": 4, "vocab_size": 256, "max_seq_len": 32, "ffn_dim": 128},
    },
    "llama3-8b": {"batch": 2, "seq": 16, "layers": 1, "options": {**LLAMA, "vocab_size": 256}},
    "moe": {
        "batch": 2,
        "seq": 16,
        "layers": 1,
        "options": {**LLAMA, "vocab_size": 256, "ffn_dim": 64, "n_experts": 4, "top_k": 2},
    },
}
MESHES = ("4", "2x2")
ROW_WISE = {**MODELS["llama3-8b"], "options": {**LLAMA, "vocab_size": 2**17}}
"""llama3-8b with 2**17 tokens of 64: gathering the embedding costs FSDP more than reducing its row-wise
lookup."""


def request(model: str, mesh: str = "4", baseline: str | None = None, **fields: Any) -> PlanRequest:
    return PlanRequest(model=model, mesh=mesh, dtype="float32", baseline=baseline, time_limit=30, **fields)


@pytest.fixture(scope="module")
def captures() -> dict[str, JointGraph]:
    """Each built-in model captured once, as the planner captures it (shared by both meshes' plans)."""
    return {}


def baseline_plans(captures: dict[str, JointGraph], model: str, mesh: str) -> dict[str, dict[str, Any]]:
    """Every baseline's plan of ``model`` on ``mesh`` that the mesh can hold."""
    fields = MODELS[model]
    if model not in captures:
        captures[model] = capture_request(request(model, **fields), fields.get("layers"))[0]
    return {
        baseline: plan_captured(request(model, mesh, baseline, **fields), captures[model], None).plan
        for baseline in BASELINES
        if not (baseline in ("fsdp_tp", "hsdp") and "x" not in mesh)
    }


def run_plans(model: str, plans: dict[str, dict[str, Any]]) -> dict[str, str]:
    """On every rank: the model of the plans' request built as `autoshard run` builds it, its step captured
    once, and each plan's step run on it and compared with one process (loss and every gradient); per plan
    ``"ok"`` or what failed (an exception, an op outside its planned placements)."""
    from runtime.device_attention import register_for
    from runtime.one_process import Reference
    from runtime.parameter_shards import local_part
    from runtime.planned_step import PlannedStep
    from runtime.worker import device_mesh
    from strategies.graph.capture import input_tensors
    from strategies.graph.passes import capture_for_planning
    from strategies.plan.planner import build_request_model

    first = next(iter(plans.values()))
    planned = PlanRequest(**first["request"])
    mesh = device_mesh("cpu", tuple(first["mesh"]["shape"]), tuple(first["mesh"]["axis_names"]))
    register_for(mesh.device_type)
    torch.manual_seed(0)
    spec = build_request_model(planned, model, planned.layers, "cpu")
    reference = Reference(copy.deepcopy(spec.module), spec)
    reference.optimizer = torch.optim.SGD(reference.module.parameters(), lr=0.0)  # the weights stay
    graph = capture_for_planning(spec.module, spec.example_inputs, spec.loss_fn)
    inputs = input_tensors(spec.example_inputs)
    outcomes = {}
    for name, plan in plans.items():
        try:
            step = PlannedStep(graph, plan, mesh)
            parameters = {
                name: torch.nn.Parameter(local_part(held.detach(), mesh, step.parameter_placements[name]))
                for name, held in spec.module.named_parameters()
            }
            result = step(parameters, dict(spec.module.named_buffers()), step.distribute_inputs(inputs))
            reference.step(result)
            outcomes[name] = f"deviations {result.deviations}" if result.deviations else "ok"
        except Exception as error:
            outcomes[name] = f"{type(error).__name__}: {error}"
    return outcomes


@pytest.mark.parametrize(("model", "mesh"), [(m, mesh) for m in MODELS for mesh in MESHES])
def test_every_baseline_of_every_built_in_model_runs_and_equals_one_process(
    ranks, captures, model, mesh
) -> None:
    plans = baseline_plans(captures, model, mesh)
    assert set(plans) == (
        {"ddp", "fsdp", "hsdp", "megatron", "fsdp_tp"} if mesh == "2x2" else {"ddp", "fsdp", "megatron"}
    )
    reports = ranks.run(run_plans, model, plans)
    for rank, outcomes in enumerate(reports):
        assert not isinstance(outcomes, RankError), f"rank {rank}: {outcomes.message}"
        assert outcomes == dict.fromkeys(plans, "ok"), f"rank {rank}: {outcomes}"


def test_fsdp_with_an_embedding_looked_up_row_wise_runs(ranks) -> None:
    """The lookup's output is ``P(mask)`` (DTensor's ``_MaskPartial``): a placement only an output has. Read
    in two placements (as the full-size llama3-8b's FSDP plan reads it: the norm replicated, the residual
    add sharded; here the add is edited to read it ``S(1)``), it is reduced twice, each time masked."""
    plan = plan_model(request("llama3-8b", "4", "fsdp", **ROW_WISE, hardware="cpu")).plan  # gloo's costs
    lookup = next(node for node in plan["nodes"] if node["op"] == "aten.embedding.default")
    assert lookup["output"] == [["P(mask)"]] and lookup["inputs"][0] == ["S(0)"], lookup
    two_readings = copy.deepcopy(plan)
    residual = next(node for node in two_readings["nodes"] if node["name"] == "add_3")
    assert residual["inputs"] == [["R"], ["R"]], residual  # the residual add reads the lookup first
    residual["inputs"], residual["output"] = [["S(1)"], ["S(1)"]], [["S(1)"]]
    plans = {"fsdp": plan, "read in two placements": two_readings}
    for rank, outcomes in enumerate(ranks.run(run_plans, "llama3-8b", plans)):
        assert outcomes == dict.fromkeys(plans, "ok"), f"rank {rank}: {outcomes}"


def test_a_baseline_the_mesh_cannot_hold_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^baseline: fsdp_tp needs a mesh of 2 or more axes$"):
        plan_model(request("mlp", "4", "fsdp_tp", **MODELS["mlp"]))


@pytest.fixture(scope="module")
def t5_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """T5 on 2x2 with the batch split over both axes (DDP: a quick solve); ``fill_`` replicated."""
    plan = plan_model(request(T5, "2x2", "ddp", axis_names="dp,tp")).plan
    path = tmp_path_factory.mktemp("plans") / "t5.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return path


def test_an_op_without_a_dtensor_rule_runs_replicated_as_planned(ranks, t5_plan) -> None:
    plan = json.loads(t5_plan.read_text())
    fills = [node for node in plan["nodes"] if node["op"] == "aten.fill_.Tensor"]
    assert fills and all(node["inputs"] == [["R", "R"], ["R", "R"]] for node in fills), fills
    assert any("aten.fill_.Tensor" in warning for warning in plan["warnings"]), plan["warnings"]
    reports = ranks.run(run_rank, RunOptions(model=T5, plan=str(t5_plan), check=True))
    for rank, report in enumerate(reports):
        assert isinstance(report, dict), f"rank {rank}: {report}"
        assert report["checked"] and report["deviations"] == []
        assert report["collectives"]["match"], report["collectives"]


def test_an_op_dtensor_cannot_run_is_named_in_one_line(ranks, t5_plan, tmp_path) -> None:
    """``fill_`` given a sharded input (a hand-edited plan): no rule says how to run it on pieces."""
    plan = json.loads(t5_plan.read_text())
    fill = next(node for node in plan["nodes"] if node["op"] == "aten.fill_.Tensor")
    fill["inputs"][0] = ["S(0)", "R"]
    path = tmp_path / "t5-sharded-fill.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    reports = ranks.run(run_rank, RunOptions(model=T5, plan=str(path)))
    for report in reports:
        assert isinstance(report, RankError), report
        message = report.message
        assert message.startswith(f"OpFailed: op {fill['name']} (aten.fill_.Tensor in "), message
        assert "inputs are not all replicated" in message and "report it with the plan" in message
        assert "\n" not in message


def test_an_input_the_op_does_not_read_goes_to_it_as_it_is(ranks, tmp_path) -> None:
    plan = plan_model(request(SLIDING_WINDOW, "2x2", axis_names="dp,tp")).plan
    new_ones = [node for node in plan["nodes"] if node["op"] == "aten.new_ones.default"]
    assert any("*" in node["inputs"][0] and "R" in node["inputs"][0] for node in new_ones), new_ones
    path = tmp_path / "sliding-window.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    reports = ranks.run(run_rank, RunOptions(model=SLIDING_WINDOW, plan=str(path), check=True))
    for rank, report in enumerate(reports):
        assert isinstance(report, dict), f"rank {rank}: {report}"
        assert report["checked"] and report["deviations"] == []


def test_placements_are_read_where_they_may_appear() -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._ops._embedding_ops import _MaskPartial

    assert read_placements(["R", "*"]) is None  # priced as not read: it does not move
    assert read_placements(None) is None
    assert read_placements(["S(1)", "R"]) == (Shard(1), Replicate())
    with pytest.raises(ValueError, match="no op reads it"):
        read_placements(["P(mask)"])
    assert parse_spec(["R", "*"], unread=True) == (R, NONE)
    with pytest.raises(ValueError, match="not a placement: '\\*'"):
        parse_spec(["R", "*"])
    lookup = (_MaskPartial(offset_shape=torch.Size([2**17, 64]), offset_dim=0),)
    assert not differs(lookup, parse_spec(["P(mask)"]))
    assert differs(lookup, parse_spec(["P"])) and differs((Replicate(),), parse_spec(["P(mask)"]))


def test_a_placement_the_plan_cannot_hold_is_the_plans_fault_not_the_models(ranks, tmp_path) -> None:
    fields = MODELS["mlp"]
    plan = plan_model(request("mlp", "4", "ddp", **fields)).plan
    graph, _ = capture_request(request("mlp", **fields), None)
    bad_input = copy.deepcopy(plan)
    bad_input["nodes"][0]["inputs"][0] = ["P(mask)"]
    name = bad_input["nodes"][0]["name"]
    with pytest.raises(
        PlanMismatch, match=rf"^plan: node {name} \(.*\): \['P\(mask\)'\]: P\(mask\) is made by"
    ):
        node_plans(bad_input, graph)
    bad_parameter = copy.deepcopy(plan)
    bad_parameter["parameters"]["w1.weight"] = ["*"]
    with pytest.raises(PlanMismatch, match=r"^plan: parameter w1.weight: not a placement: '\*'"):
        check_shapes(bad_parameter, graph)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad_input), encoding="utf-8")
    reports = ranks.run(run_rank, RunOptions(model="mlp", plan=str(path)))
    for report in reports:
        assert isinstance(report, RankError) and report.message.startswith(f"PlanMismatch: plan: node {name}")


def test_the_launcher_logs_no_traceback_for_a_failure_said_in_one_line() -> None:
    def record(error: Exception) -> logging.LogRecord:
        try:
            raise error
        except Exception:
            return logging.LogRecord("launcher", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())

    quiet = _ExpectedFailures()
    assert not quiet.filter(record(RuntimeError(f"Traceback ...\nRuntimeError: {ERROR_MARK}2:plan: ...")))
    assert quiet.filter(record(RuntimeError("Traceback ...\nKeyError: 'w1'")))  # a bug keeps its traceback
    assert quiet.filter(logging.LogRecord("launcher", logging.INFO, __file__, 1, "started", None, None))
