"""Sharded checkpoints: saved under one plan (DDP on a 2x2 mesh), loaded under another (Megatron on a mesh of
4), and training goes on exactly as if it had never stopped."""

from __future__ import annotations

import pytest

from runtime.worker import RunOptions, run_rank
from tests.runtime.test_planned_step import write_plan


def test_a_checkpoint_saved_under_one_plan_continues_under_another(ranks, tmp_path) -> None:
    ddp, megatron = write_plan(tmp_path, "gpt", "2x2", "ddp"), write_plan(tmp_path, "gpt", "4", "megatron")
    common = {"model": "gpt2-small", "optimizer": "adamw", "lr": 1e-3}
    straight = ranks.run(run_rank, RunOptions(plan=str(ddp), steps=4, **common))[0]
    saved = ranks.run(
        run_rank, RunOptions(plan=str(ddp), steps=2, save=str(tmp_path / "ckpt"), check=True, **common)
    )
    resumed = ranks.run(
        run_rank, RunOptions(plan=str(megatron), steps=2, load=str(tmp_path / "ckpt"), check=True, **common)
    )
    for report in (straight, *saved, *resumed):
        assert isinstance(report, dict), report
    assert saved[0]["loss"] == pytest.approx(straight["loss"][:2], rel=1e-6)
    # the resumed run starts where the saved one stopped: step 2 and 3 of the straight run
    assert resumed[0]["loss"] == pytest.approx(straight["loss"][2:], rel=1e-4)
    assert resumed[0]["loss"][0] < saved[0]["loss"][-1]
    assert resumed[0]["checked"]  # and equals one process started from the checkpoint's weights and state
