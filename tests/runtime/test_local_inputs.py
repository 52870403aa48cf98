"""Local batches: which part of each input a rank loads under a plan (`runtime.local_inputs`), and a step
given each rank's parts equals the step given the global batch (4 gloo ranks)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

import autoshard
from runtime.local_inputs import input_slices, mesh_coordinate, part_of
from runtime.plan_checks import PlanMismatch, input_placements
from strategies.plan.planner import PlanRequest, plan_model


def rows(shape: tuple[int, ...], mesh: tuple[int, ...], placements: list[Any]) -> list[tuple[slice, ...]]:
    """Every rank's part, in rank order."""
    return [
        part_of(shape, mesh, mesh_coordinate(rank, mesh), placements, "x") for rank in range(math.prod(mesh))
    ]


def test_ranks_are_laid_out_row_major_as_init_device_mesh_does() -> None:
    assert [mesh_coordinate(rank, (2, 3)) for rank in range(6)] == [
        [0, 0],
        [0, 1],
        [0, 2],
        [1, 0],
        [1, 1],
        [1, 2],
    ]
    with pytest.raises(ValueError, match="rank: 6 is not on a mesh of 6 devices"):
        mesh_coordinate(6, (2, 3))


def test_each_rank_loads_the_part_dtensor_gives_it() -> None:
    batch_over_dp = rows((8, 4), (2, 2), [Shard(0), Replicate()])
    assert [s[0] for s in batch_over_dp] == [slice(0, 4), slice(0, 4), slice(4, 8), slice(4, 8)]
    assert all(s[1] == slice(0, 4) for s in batch_over_dp)
    over_both = rows((8, 4), (2, 2), [Shard(0), Shard(0)])
    assert [s[0] for s in over_both] == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    columns = rows((8, 4), (2, 2), [Replicate(), Shard(1)])
    assert [s[1] for s in columns] == [slice(0, 2), slice(2, 4), slice(0, 2), slice(2, 4)]
    uneven = rows((5,), (4,), [Shard(0)])  # torch.chunk's sizes: 2, 2, 1 and an empty piece
    assert [s[0] for s in uneven] == [slice(0, 2), slice(2, 4), slice(4, 5), slice(5, 5)]
    with pytest.raises(PlanMismatch, match="x is planned as a partial sum"):
        part_of((8,), (4,), [0], [Partial()], "x")


def test_a_plan_says_which_part_of_the_batch_each_rank_loads() -> None:
    plan = plan_model(
        PlanRequest(model="mlp", mesh="2x2", batch=64, dtype="float32", baseline="ddp", time_limit=10)
    ).plan
    assert plan["inputs"][0] == ["S(0)", "S(0)"]  # DDP: the batch over every device
    shapes = [(64, 1024), (64, 1024)]
    placements = input_placements(plan, len(shapes))
    assert input_slices(placements, shapes, (2, 2), [1, 0])[0] == (slice(32, 48), slice(0, 1024))
    example = [torch.zeros(shape) for shape in shapes]
    assert [autoshard.Plan(plan).input_slices(rank, example)[1][0] for rank in range(4)] == [
        slice(16 * rank, 16 * rank + 16) for rank in range(4)
    ]
    with pytest.raises(PlanMismatch, match="the plan places 2 inputs, the model takes 1"):
        autoshard.Plan(plan).input_slices(0, example[:1])


def _local_and_global(plan: dict[str, Any]) -> tuple[float, float, float]:
    """On each rank: one step on the global batch, one on this rank's parts; (loss, loss, the largest
    gradient difference)."""
    from runtime.worker import device_mesh
    from strategies.models.builder import build_model

    torch.manual_seed(0)
    spec = build_model("mlp", batch=64, seq=1, dtype=torch.float32, device="cpu", d=64, h=256)
    mesh = device_mesh("cpu", tuple(plan["mesh"]["shape"]), tuple(plan["mesh"]["axis_names"]))
    step = autoshard.apply(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn)
    whole = step(spec.example_inputs)
    tensors = list(spec.example_inputs)
    parts = [t[s] for t, s in zip(tensors, step.input_slices(), strict=True)]
    local = step(parts, local=True)
    largest = max(
        float((whole.gradients[n].full_tensor() - local.gradients[n].full_tensor()).abs().max())
        for n in whole.gradients
    )
    with pytest.raises(ValueError, match="this rank's part has shape"):
        step([t[:1] for t in tensors], local=True)
    return float(whole.loss.full_tensor()), float(local.loss.full_tensor()), largest


@pytest.mark.parametrize("layout", ["ddp", "fsdp_tp"])
def test_a_step_on_each_ranks_own_part_equals_the_step_on_the_whole_batch(ranks, layout) -> None:
    request = PlanRequest(
        model="mlp",
        mesh="2x2",
        batch=64,
        dtype="float32",
        baseline=layout,
        time_limit=10,
        options={"d": 64, "h": 256},
    )
    plan = plan_model(request).plan
    for whole, local, largest in ranks.run(_local_and_global, plan):
        assert local == whole and largest == 0.0


def _pipeline_local_and_global(plan: dict[str, Any]) -> dict[str, Any]:
    """On each rank of a pipeline plan: one step on the global batch, one on this rank's parts of each
    micro-batch (only the inputs its stages read); the losses, the largest gradient difference, its slices
    and the plan's (`autoshard.Plan.input_slices`) for the same rank."""
    import torch.distributed as dist

    from runtime import random_ops
    from runtime.worker import device_mesh
    from strategies.graph.capture import input_tensors
    from strategies.models.builder import build_model

    torch.manual_seed(0)
    spec = build_model(
        "gpt2-small", batch=8, seq=32, dtype=torch.float32, device="cpu", layers=2, **GPT_UNTIED
    )
    mesh = device_mesh("cpu", tuple(plan["mesh"]["shape"]), tuple(plan["mesh"]["axis_names"]))
    step = autoshard.apply(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn)
    random_ops.seed_step(0, 0)
    whole = step(spec.example_inputs)
    tensors = input_tensors(spec.example_inputs)
    slices = step.input_slices()
    parts = [
        torch.cat([t[s] for s in pieces]) if pieces else t[:0]
        for t, pieces in zip(tensors, slices, strict=True)
    ]
    random_ops.seed_step(0, 0)
    local = step(parts, local=True)
    largest = max(
        float((whole.gradients[n].full_tensor() - local.gradients[n].full_tensor()).abs().max())
        for n in whole.gradients
    )
    read = next(k for k, pieces in enumerate(slices) if pieces)
    wrong = [*parts]
    wrong[read] = parts[read][1:]
    with pytest.raises(ValueError, match=rf"input {read}: this rank's part has shape"):
        step(wrong, local=True)
    return {
        "losses": (float(whole.loss.full_tensor()), float(local.loss.full_tensor())),
        "largest": largest,
        "slices": slices,
        "planned": autoshard.Plan(plan).input_slices(dist.get_rank(), spec.example_inputs),
    }


GPT_UNTIED = {
    "dim": 128,
    "n_heads": 4,
    "vocab_size": 256,
    "max_seq_len": 64,
    "ffn_dim": 512,
    "tie_embeddings": False,
}


@pytest.mark.parametrize("inputs", ["R", "S(0)"])
def test_a_pipeline_step_on_each_ranks_parts_of_its_micro_batches_equals_the_whole_batch(
    ranks, inputs: str
) -> None:
    request = PlanRequest(
        model="gpt2-small", mesh="2x2", axis_names="pp,dp", batch=8, seq=32, layers=2, dtype="float32",
        options=GPT_UNTIED, microbatches=2, schedule="1f1b", time_limit=30, hardware="cpu",
    )  # fmt: skip
    plan = plan_model(request).plan
    # the planner loads the token ids and labels whole (the embedding's output is cut over dp for free); the
    # same plan with them cut over dp (each micro-batch's rows), its first readers gathering them
    assert plan["inputs"] == [["R"], ["R"]]
    plan["inputs"] = [[inputs], [inputs]]
    answers = ranks.run(_pipeline_local_and_global, plan)
    for rank, answer in enumerate(answers):
        whole, local = answer["losses"]
        assert local == whole and answer["largest"] == 0.0, (rank, answer)
        # the micro-batches are rows 0:4 and 4:8; over dp, each dp coordinate loads half of each
        dp = rank % 2
        halves = [(slice(2 * dp, 2 * dp + 2), slice(0, 32)), (slice(4 + 2 * dp, 6 + 2 * dp), slice(0, 32))]
        mine = [(slice(0, 4), slice(0, 32)), (slice(4, 8), slice(0, 32))] if inputs == "R" else halves
        assert answer["planned"] == [mine, mine]
        # the first stage reads the token ids, the last the labels (the loss): each loads only what it reads
        first_stage = rank < 2
        assert answer["slices"] == ([mine, []] if first_stage else [[], mine]), (rank, answer["slices"])
