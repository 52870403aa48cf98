"""`import autoshard`: the library calls a launcher makes (docs/python-api.md), in one process and, for the
page's own example, under `torchrun` on 4 gloo ranks exactly as the page says to run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import autoshard

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "python-api.md"


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 128)
        self.down = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.down(torch.relu(self.up(x))), target)


_SEEDED = torch.Generator().manual_seed(0)  # the same batch in every process that imports this module (ranks)
BATCH = (torch.randn(256, 32, generator=_SEEDED), torch.randn(256, 32, generator=_SEEDED))


@pytest.fixture(scope="module")
def planned() -> autoshard.Plan:
    return autoshard.plan(TwoLayers(), BATCH, "2x2", axis_names=("dp", "tp"), time_limit=10)


def test_a_module_plans_on_a_mesh_given_by_its_shape(planned, tmp_path) -> None:
    assert planned.mesh_shape == (2, 2) and planned.axis_names == ("dp", "tp")
    assert set(planned.parameters) == {"up.weight", "up.bias", "down.weight", "down.bias"}
    assert planned.step_time_s > 0 and planned.peak_memory_bytes > 0 and planned.recompute == []
    assert planned.summary().startswith("plan for the graph 'TwoLayers' on dp=2 x tp=2 (h100)")
    planned.save(tmp_path / "plan.json")
    assert autoshard.load_plan(tmp_path / "plan.json") == planned


def test_a_plan_planned_from_an_exported_graph_is_the_same_request() -> None:
    document = autoshard.export_graph(TwoLayers(), BATCH)
    assert document["model"] == "TwoLayers" and document["nodes"]
    again = autoshard.plan(document, None, (4,), time_limit=10)
    assert again.mesh_shape == (4,) and again.axis_names == ("dp",)


def test_bad_meshes_budgets_and_plans_are_refused_in_the_callers_terms(tmp_path) -> None:
    with pytest.raises(ValueError, match="mesh: every axis size must be a positive integer, got '2x0'"):
        autoshard.plan(TwoLayers(), BATCH, "2x0")
    with pytest.raises(ValueError, match="axis_names: 1 names for a 2-D mesh"):
        autoshard.plan(TwoLayers(), BATCH, (2, 2), axis_names=("dp",))
    with pytest.raises(autoshard.InfeasibleError, match="smallest peak any plan can reach"):
        autoshard.plan(TwoLayers(), BATCH, "4", memory_gib=1e-6, time_limit=5)
    (tmp_path / "old.json").write_text('{"version": 0}', encoding="utf-8")
    with pytest.raises(autoshard.PlanMismatch, match="version 0 is not one this runtime knows"):
        autoshard.load_plan(tmp_path / "old.json")


def test_the_pages_example_trains_under_torchrun_on_four_ranks(tmp_path) -> None:
    """The one Python block of docs/python-api.md, saved as the page says and run with its command."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) == 1
    (tmp_path / "train_tiny.py").write_text(blocks[0], encoding="utf-8")
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "4", "train_tiny.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"^step \d+: loss ([0-9.]+)$", done.stdout, flags=re.MULTILINE)]
    assert len(losses) == 10 and losses[-1] < 0.5 * losses[0], done.stdout
    assert "plan for the graph 'MLP' on dp=2 x tp=2 (cpu)" in done.stdout
    assert autoshard.load_plan(tmp_path / "plan.json").mesh_shape == (2, 2)


LLAMA = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "ffn_dim": 128, "max_seq_len": 64}


def _llama(layers: int) -> Any:
    from strategies.models.builder import build_model

    torch.manual_seed(0)
    return build_model(
        "llama3-8b", batch=4, seq=16, dtype=torch.float32, device="cpu", layers=layers, **LLAMA
    )


def _short_capture_step(plan: dict[str, Any], document: dict[str, Any]) -> float:
    """On each rank: the 6-layer model, the plan of its 4-layer document applied with that document, one
    step; the loss."""
    from runtime.worker import device_mesh

    spec = _llama(6)
    mesh = device_mesh("cpu", (4,), ("dp",))
    step = autoshard.apply(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn, graph=document)
    return float(step(spec.example_inputs).loss.full_tensor())


def test_a_plan_of_a_short_captures_document_applies_to_the_whole_stack(ranks) -> None:
    from strategies.graph.export import export_graph

    short = _llama(4)
    document = export_graph(short.module, short.example_inputs, short.loss_fn, total_layers=6)
    plan = autoshard.plan(document, None, "4", baseline="fsdp", time_limit=10)
    assert plan.document["layers"] == {"captured": 4, "total": 6}
    losses = ranks.run(_short_capture_step, plan.document, document)
    whole = _llama(6)
    expected = whole.module(*whole.example_inputs).item()  # the model returns its loss
    assert losses == [pytest.approx(expected, rel=1e-5)] * 4


def _mixed_step(plan: dict[str, Any]) -> float:
    """On each rank: the fp32 module, the mixed-precision plan applied, one step; the loss."""
    from runtime.worker import device_mesh

    torch.manual_seed(0)
    module = TwoLayers()
    mesh = device_mesh("cpu", (4,), ("dp",))
    step = autoshard.apply(module, plan, mesh, BATCH)
    assert all(p.dtype is torch.float32 for p in module.parameters())
    return float(step(BATCH).loss.full_tensor())


def test_a_launchers_module_plans_and_runs_in_mixed_precision(ranks) -> None:
    torch.manual_seed(0)
    module = TwoLayers()
    plan = autoshard.plan(module, BATCH, "4", compute_dtype="bfloat16", baseline="ddp", time_limit=10)
    assert plan.document["request"]["compute_dtype"] == "bfloat16"
    losses = ranks.run(_mixed_step, plan.document)
    copies = {name: p.detach().to(torch.bfloat16) for name, p in module.named_parameters()}
    inputs = tuple(x.to(torch.bfloat16) for x in BATCH)
    expected = torch.func.functional_call(module, copies, inputs).item()
    assert losses == [pytest.approx(expected, rel=1e-2)] * 4
