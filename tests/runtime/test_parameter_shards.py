"""Each rank makes only its own shards: a model built on the meta device is initialised piece by piece as one
process would initialise it whole, or reads its pieces of weights on disk (safetensors, a DCP checkpoint
written under another plan); a run built so checks itself against one process run in a process of its own."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from runtime.apply import AppliedPlan, apply_plan
from runtime.parameter_shards import meta_parameters, place_parameters
from runtime.run_setup import RunOptions, build_run_model, load_plan
from runtime.worker import device_mesh, run_rank
from tests.runtime.test_planned_step import MODELS, write_plan


def _apply(options: RunOptions, weights: str | None = None) -> tuple[nn.Module, AppliedPlan]:
    """On a rank: the model ``options`` build (sharded or not) with its plan applied."""
    plan = load_plan(options.plan)
    mesh = device_mesh("cpu", tuple(plan["mesh"]["shape"]), tuple(plan["mesh"]["axis_names"]))
    spec, short = build_run_model(options, plan)
    applied = apply_plan(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn, short, weights=weights)
    return spec.module, applied


def _applied(options: RunOptions, weights: str | None = None) -> dict[str, torch.Tensor]:
    """The plan applied to the model ``options`` build, every parameter made whole."""
    _, applied = _apply(options, weights)
    return {name: parameter.full_tensor() for name, parameter in applied.parameters.items()}


def _whole(options: RunOptions) -> dict[str, torch.Tensor]:
    spec, _ = build_run_model(options, load_plan(options.plan), whole=True)
    return {name: parameter.detach() for name, parameter in spec.module.named_parameters()}


def _differing(options: RunOptions, weights: str | None = None) -> list[str]:
    """On a rank: the parameters whose sharded build differs, bit for bit, from the whole one."""
    made, whole = _applied(options, weights), _whole(options)
    assert set(made) == set(whole), (sorted(made), sorted(whole))
    return [name for name in made if not torch.equal(made[name], whole[name])]


@pytest.mark.parametrize(("name", "mesh", "layout"), [("gpt", "2x2", "fsdp_tp"), ("deep", "4", "megatron")])
def test_shards_made_on_each_rank_equal_the_model_one_process_builds_bit_for_bit(
    ranks, tmp_path, name, mesh, layout
) -> None:
    plan = write_plan(tmp_path, name, mesh, layout)  # the GPT ties its head to its embedding
    options = RunOptions(model=MODELS[name][0], plan=str(plan), meta_init=True, seed=3)
    assert ranks.run(_differing, options) == [[]] * 4


def _checks_a_changed_weight(path: str, options: RunOptions) -> str:
    """On a rank: the check's message when one weight of the one-process file is off by one."""
    from safetensors.torch import save_file

    from runtime.one_process import CheckFailed, FileReference

    _, applied = _apply(options)
    held = {f"param.{name}": value.full_tensor() for name, value in applied.parameters.items()}
    held["param.layers.1.mlp.c_fc.bias"] = held["param.layers.1.mlp.c_fc.bias"] + 1
    if torch.distributed.get_rank() == 0:
        scales = {f"scale.{key}": value.abs().max().double().reshape(1) for key, value in held.items()}
        save_file({**held, **scales}, path)
    torch.distributed.barrier()
    try:
        FileReference(Path(path), torch.float32).compare_parameters(
            applied.parameters, RunOptions(model="", plan="", steps=0)
        )
    except CheckFailed as error:
        return str(error)
    return "passed"


def test_each_rank_compares_its_own_shards_and_names_the_one_that_differs(ranks, tmp_path) -> None:
    plan = write_plan(tmp_path, "gpt", "2x2", "fsdp_tp")
    options = RunOptions(model="gpt2-small", plan=str(plan), meta_init=True)
    said = ranks.run(_checks_a_changed_weight, str(tmp_path / "changed.safetensors"), options)
    assert all(m.startswith("layers.1.mlp.c_fc.bias after 0 steps differs from one process") for m in said), (
        said
    )


def _saves_state(directory: str, options: RunOptions) -> None:
    """On a rank: the planned model's own state dict, saved with DCP."""
    import torch.distributed.checkpoint as dcp

    module, _ = _apply(options)
    dcp.save(module.state_dict(), checkpoint_id=directory)


def test_weights_are_read_into_the_planned_placements_from_safetensors_and_from_dcp(ranks, tmp_path) -> None:
    from safetensors.torch import save_file

    fsdp_tp, megatron = (
        write_plan(tmp_path, "gpt", "2x2", "fsdp_tp"),
        write_plan(tmp_path, "gpt", "4", "megatron"),
    )
    seeded = RunOptions(model="gpt2-small", plan=str(fsdp_tp), seed=7)
    whole = _whole(seeded)
    # Hugging Face's layout: two files and an index; the tied head is stored once, under the embedding's name
    folder = tmp_path / "hf"
    folder.mkdir()
    names = sorted(name for name in whole if name != "lm_head.weight")
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({name: whole[name].contiguous() for name in part}, str(folder / file))
    index = {"weight_map": {name: file for file, part in halves.items() for name in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    reading = RunOptions(model="gpt2-small", plan=str(megatron), seed=0, weights=str(folder))
    assert ranks.run(_read_equals, reading, str(folder), whole) == [True] * 4
    # a DCP checkpoint of the state under one plan, read under another
    ranks.run(_saves_state, str(tmp_path / "dcp"), seeded)
    reading = RunOptions(model="gpt2-small", plan=str(megatron), seed=0, weights=str(tmp_path / "dcp"))
    assert ranks.run(_read_equals, reading, str(tmp_path / "dcp"), whole) == [True] * 4


def _read_equals(options: RunOptions, weights: str, whole: dict[str, torch.Tensor]) -> bool:
    made = _applied(options, weights)
    return set(made) == set(whole) and all(torch.equal(made[name], whole[name]) for name in made)


def test_a_run_reading_its_weights_trains_as_the_whole_build_and_checks_in_a_process_of_its_own(
    ranks, tmp_path
) -> None:
    """The whole build's weights saved as safetensors (the tied head under the embedding's name only), then
    read by each rank into its own shards: the same two AdamW steps as the whole build, checked against one
    process that rank 0 ran in a process of its own (`--meta-init` takes that path too)."""
    from safetensors.torch import save_file

    plan = write_plan(tmp_path, "gpt", "2x2", "fsdp_tp")
    common = {
        "model": "gpt2-small",
        "plan": str(plan),
        "steps": 2,
        "optimizer": "adamw",
        "lr": 1e-3,
        "seed": 11,
    }
    weights = _whole(RunOptions(**common))
    stored = {name: value.contiguous() for name, value in weights.items() if name != "lm_head.weight"}
    save_file(stored, str(tmp_path / "w.safetensors"))
    whole = ranks.run(run_rank, RunOptions(**common))
    read = ranks.run(run_rank, RunOptions(**common, weights=str(tmp_path / "w.safetensors"), check=True))
    for report in (*whole, *read):
        assert isinstance(report, dict), report
    assert read[0]["checked"] and read[0]["deviations"] == []
    assert read[0]["loss"] == whole[0]["loss"]  # the same weights, the same steps
    assert not list(Path(tempfile.gettempdir()).glob("autoshard-reference-*/*"))  # removed once compared
    assert len(read[0]["memory"]["max_rss_bytes_per_rank"]) == 4


class _NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))


def _one_parameter_graph(module: nn.Module) -> Any:
    return SimpleNamespace(parameters={name: None for name, _ in module.named_parameters()}, tied={})


def test_what_cannot_be_made_on_a_rank_is_refused_naming_it() -> None:
    with meta_parameters():
        module = nn.Sequential(_NoReset(), nn.Linear(4, 4))
    assert module[0].scale.is_meta and module[1].weight.is_meta
    with pytest.raises(
        ValueError, match=r"parameter 0\.scale is on the meta device and _NoReset has no reset"
    ):
        place_parameters(module, _one_parameter_graph(module), {}, None)  # type: ignore[arg-type]
    with torch.device("meta"):  # everything on meta: the buffer its constructor computed is gone
        normed = nn.BatchNorm1d(4)
    with pytest.raises(
        ValueError, match=r"buffer running_mean \(BatchNorm1d\) is on the meta device.*meta_init"
    ):
        place_parameters(normed, _one_parameter_graph(normed), {}, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"neither a torch\.distributed\.checkpoint directory"):
        place_parameters(normed, _one_parameter_graph(normed), {}, None, weights="/nonexistent")  # type: ignore[arg-type]


def test_tensors_are_compared_piece_by_piece_with_the_whole_tensors_scale(monkeypatch) -> None:
    from runtime import one_process
    from runtime.one_process import CheckFailed, compare

    monkeypatch.setattr(one_process, "COMPARED_AT_ONCE", 3)  # 10 elements in 4 pieces
    expected = torch.arange(10, dtype=torch.float32)
    compare("x", expected + 1e-4, expected)  # within 1e-5 + 1e-4 x 9
    with pytest.raises(CheckFailed, match=r"largest difference 0\.5 \(allowed 0\.00091"):
        compare("x", expected + torch.tensor([0.0] * 9 + [0.5]), expected)  # the last piece
    with pytest.raises(CheckFailed, match="largest difference nan"):
        compare("x", expected.clone().index_fill_(0, torch.tensor([4]), float("nan")), expected)
    # a slice compared with the whole tensor's scale: 0.1 off is within 1e-4 x 1000
    compare("x", expected[:2] + 0.05, expected[:2], scale=1000.0)


def test_slices_are_read_from_safetensors_by_blocks_of_rows_exactly(tmp_path, monkeypatch) -> None:
    from safetensors.torch import save_file

    from runtime import safetensors_slices
    from runtime.safetensors_slices import entries, read

    tensors = {
        "table": torch.randn(37, 11, dtype=torch.bfloat16),
        "cube": torch.randn(5, 6, 7),
        "ids": torch.arange(9, dtype=torch.int64),
        "scale": torch.tensor(2.5, dtype=torch.float64),
    }
    save_file(tensors, str(tmp_path / "t.safetensors"))
    monkeypatch.setattr(safetensors_slices, "BLOCK_BYTES", 50)  # a block of two or three rows
    held = entries(tmp_path / "t.safetensors")
    assert {name: (entry.dtype, entry.shape) for name, entry in held.items()} == {
        name: (value.dtype, tuple(value.shape)) for name, value in tensors.items()
    }
    cuts = {
        "table": (slice(3, 30), slice(5, 11)),  # a column shard: whole rows read, columns kept
        "cube": (slice(1, 5), slice(0, 3), slice(2, 7)),
        "ids": (slice(4, 4),),  # an empty piece (uneven sharding)
    }
    for name, cut in cuts.items():
        assert torch.equal(read(tmp_path / "t.safetensors", held[name], cut), tensors[name][cut]), name
    for name, value in tensors.items():
        assert torch.equal(read(tmp_path / "t.safetensors", held[name]), value), name
