"""Random ops under sharding draw what one process draws (`runtime/random_ops.py`), and `run --check` passes
on the zoo's GPT-2 in training mode (dropout on) under a data-parallel and a tensor-parallel plan (4 ranks).

The plans come from the baselines on a made-up machine whose compute is slow against its links, so the solver
shards the activations, dropout masks included, rather than replicating them as it does for a tiny model on
a real GPU; the test asserts the masks are sharded as intended before it runs them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx
from torch.distributed.tensor import DTensor, distribute_tensor

from runtime.one_process import CheckFailed, compare, naming_randomness
from runtime.random_ops import draws_random, run_whole
from runtime.worker import RunOptions, device_mesh, run_rank
from strategies.cost.hardware import PLAIN_ROOFLINE
from strategies.placement import parse_spec, to_dtensor
from strategies.plan.planner import PlanRequest, plan_model

aten = torch.ops.aten

GPT2 = f"{Path(__file__).resolve().parents[1] / 'strategies' / 'models' / 'user_models' / 'zoo.py'}:gpt2"
SHAPE = (6, 4, 10)
"""Dim 0 cut 4 ways is uneven (2, 2, 2, 0): the empty piece must still draw nothing and keep the stream."""
PLACEMENTS = (
    ["R", "R"],
    ["S(0)", "R"],
    ["R", "S(2)"],
    ["S(0)", "S(2)"],
    ["S(2)", "S(2)"],
    ["S(1)", "S(0)"],
    ["S(0)", "S(0)"],
)
DRAWS = {  # op -> arguments after the tensor; the tensor's values count only for bernoulli.default
    "bernoulli_": (aten.bernoulli_.float, (0.3,)),
    "normal_": (aten.normal_.default, (0.0, 2.0)),
    "rand_like": (aten.rand_like.default, ()),
    "bernoulli": (aten.bernoulli.default, ()),
}


def _draw_job() -> list[tuple[str, list[str], bool, bool]]:
    """Per op and placement on this rank: (op, placements, the whole values equal one process's, the
    generator's state after equals one process's)."""
    mesh = device_mesh("cpu", (2, 2), ("dp", "tp"))
    torch.manual_seed(1)
    probabilities = torch.rand(SHAPE)  # every rank alike
    found = []
    for name, (op, rest) in DRAWS.items():
        graph = fx.Graph()
        source = graph.placeholder("x")
        source.meta["val"] = torch.empty(SHAPE)
        node = graph.call_function(op, (source, *rest))
        torch.manual_seed(7)
        expected = op(probabilities.clone(), *rest)
        state = torch.get_rng_state()
        for placements in PLACEMENTS:
            placed = to_dtensor(parse_spec(placements))
            torch.manual_seed(7)
            held = distribute_tensor(probabilities.clone(), mesh, placed, src_data_rank=None)
            with torch.no_grad():
                result, _ = run_whole(node, (held, *rest), {})
            if isinstance(result, DTensor):  # written in place: this rank's piece of one process's values
                same = torch.equal(result.to_local(), _piece(expected, mesh, placed))
            else:  # a new output, whole on every rank (the planned step then cuts it)
                same = torch.equal(result, expected)
            found.append((name, placements, same, torch.equal(torch.get_rng_state(), state)))
    return found


def _piece(whole: torch.Tensor, mesh: Any, placements: Any) -> torch.Tensor:
    return distribute_tensor(whole, mesh, placements, src_data_rank=None).to_local()


def test_a_sharded_random_op_draws_what_one_process_draws(ranks) -> None:
    for rank, found in enumerate(ranks.run(_draw_job)):
        assert isinstance(found, list), f"rank {rank}: {found}"
        assert len(found) == len(DRAWS) * len(PLACEMENTS)
        differing = [(name, placements) for name, placements, same, _ in found if not same]
        assert differing == [], f"rank {rank}: values differ from one process for {differing}"
        desynced = [(name, placements) for name, placements, _, same_state in found if not same_state]
        assert desynced == [], f"rank {rank}: the generator ends elsewhere than one process's for {desynced}"


def test_which_ops_draw() -> None:
    x = torch.empty(2, 3)
    assert draws_random(aten.bernoulli_.float, (x, 0.9), {})
    assert draws_random(aten.randint.default, (10, [2]), {})
    assert draws_random(aten.native_dropout.default, (x, 0.1, True), {})
    assert not draws_random(aten.native_dropout.default, (x, 0.1, False), {})  # eval: no draw
    attention = aten._scaled_dot_product_flash_attention_for_cpu.default
    assert not draws_random(attention, (x, x, x), {})  # dropout_p defaults to 0
    assert not draws_random(attention, (x, x, x), {"dropout_p": 0.0})
    assert draws_random(attention, (x, x, x, 0.1), {})
    assert not draws_random(aten.mul.Tensor, (x, x), {})


def test_a_check_failing_on_a_step_with_random_ops_says_so() -> None:
    with pytest.raises(CheckFailed) as failed, naming_randomness({"aten.bernoulli_.float": 7}):
        compare("loss", torch.tensor(1.0), torch.tensor(2.0))
    message = str(failed.value)
    assert message.startswith("loss differs from one process")
    assert "random numbers (7 aten.bernoulli_.float)" in message and "\n" not in message


SLOW_COMPUTE = {  # every FLOP and byte costs, a collective almost nothing: sharding the activations pays
    "base": "h100",
    **PLAIN_ROOFLINE,
    "memory_bandwidth": 1e10,
    "intra_node": {"bandwidth": 1e12, "latency": 1e-7},
    "launch_s": 1e-9,
    "collective_launch_s": 1e-7,
}
SHARDED_PLANS = {  # layout -> (float32 FLOP/s, the mask placement that must be among the plan's)
    "ddp": (1e10, ["S(0)", "S(0)"]),  # the batch over both axes
    "megatron": (1e11, ["S(0)", "S(2)"]),  # the batch over dp, the hidden dim over tp
}


@pytest.mark.parametrize("layout", sorted(SHARDED_PLANS))
def test_gpt2_with_dropout_equals_one_process_under_a_sharded_plan(ranks, tmp_path, layout) -> None:
    flops, wanted = SHARDED_PLANS[layout]
    hardware = tmp_path / "slow-compute.json"
    hardware.write_text(json.dumps({**SLOW_COMPUTE, "peak_flops": {"float32": flops}}), encoding="utf-8")
    request = PlanRequest(
        model=GPT2, mesh="2x2", axis_names="dp,tp", dtype="float32", baseline=layout, hardware=str(hardware)
    )
    plan = plan_model(request).plan
    masks = [node["inputs"][0] for node in plan["nodes"] if node["op"] == "aten.bernoulli_.float"]
    assert wanted in masks, masks
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    reports = ranks.run(run_rank, RunOptions(model=GPT2, plan=str(path), steps=2, check=True))
    for rank, report in enumerate(reports):
        assert isinstance(report, dict), f"rank {rank}: {report}"
    report = reports[0]
    assert report["checked"] and report["deviations"] == []
    assert report["random_ops"]["ops"] == {"aten.bernoulli_.float": 7}
    assert all(r["loss"] == report["loss"] for r in reports)
