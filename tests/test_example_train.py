"""The example launcher (`examples/train.py`) as a user runs it: 10 steps under `torchrun` on 4 gloo ranks
from meta-device initialisation with a plan solved in the job, a sharded checkpoint, then 10 more steps
resumed from it under another plan fetched from a running `autoshard serve`; the 20 losses are those of the
same training on one process in plain PyTorch."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train.py"


def _torchrun(*arguments: str, cwd: Path) -> str:
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [str(torchrun), "--standalone", "--nproc-per-node", "4", str(EXAMPLE), *arguments]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _one_process(steps: int) -> list[float]:
    """The example's own one-process run (``python examples/train.py``), in this process."""
    spec = importlib.util.spec_from_file_location("autoshard_example_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    defaults = {"steps": steps, "batch": 8, "seq": 32, "lr": 3e-3, "warmup": 4, "seed": 0}
    return example.train_one_process(argparse.Namespace(**defaults))


def test_the_example_trains_resumes_under_another_plan_and_equals_one_process(tmp_path) -> None:
    checkpoint = tmp_path / "ckpt"
    first = _torchrun(
        *("--mesh", "2x2", "--axis-names", "dp,tp", "--baseline", "fsdp_tp", "--stop-after", "10"),
        *("--save", str(checkpoint), "--losses", "first.json"),
        cwd=tmp_path,
    )
    assert "model.layers.[0-1].mlp.down_proj.weight" in first and "[S(0), S(1)]" in first  # FSDP x TP
    assert (checkpoint / ".metadata").is_file()
    server = ServerProcess(f"sqlite:///{tmp_path / 'service.db'}", tmp_path / "service.log").start()
    try:
        second = _torchrun(
            *("--mesh", "4", "--baseline", "megatron", "--service", server.url, "--resume", str(checkpoint)),
            *("--losses", "second.json"),
            cwd=tmp_path,
        )
    finally:
        server.stop()
    assert re.search(r"model\.layers\.\[0-1\]\.mlp\.down_proj\.weight +\[S\(1\)\]", second)  # Megatron on 4
    losses = {
        int(step): loss
        for name in ("first.json", "second.json")
        for step, loss in json.loads((tmp_path / name).read_text(encoding="utf-8")).items()
    }
    assert sorted(losses) == list(range(20))
    one = _one_process(20)
    assert [losses[step] for step in range(20)] == pytest.approx(one, rel=1e-4)  # float32
    assert one[-1] < 0.6 * one[0]  # it learns
