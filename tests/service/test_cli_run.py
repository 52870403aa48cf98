"""`autoshard run`: starts its ranks through PyTorch's elastic launcher (or runs as a rank of `torchrun`),
checks against one process, writes the report; refusals exit 2 with one line naming the field."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strategies.plan.planner import PlanRequest, plan_model

ROOT = Path(__file__).resolve().parents[2]


def command(*args: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *launcher, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _mlp_plan(folder: Path, mesh: str) -> Path:
    request = PlanRequest(
        model="mlp", mesh=mesh, batch=64, dtype="float32", options={"d": 256, "h": 1024}, baseline="ddp"
    )
    path = folder / f"mlp-{mesh}.json"
    path.write_text(json.dumps(plan_model(request).plan), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mlp_plan(tmp_path_factory.mktemp("plans"), "2x2")


@pytest.fixture(scope="module")
def pair_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """On two ranks: the launcher's behaviour the tests pin does not need four (half the processes)."""
    return _mlp_plan(tmp_path_factory.mktemp("plans"), "2")


def test_run_checks_against_one_process_and_writes_the_report(pair_plan: Path, tmp_path: Path) -> None:
    """On two ranks (the README's quickstart runs the same command on four, `tests/test_docs.py`)."""
    report_path = tmp_path / "report.json"
    run = command(
        "run", "--model", "mlp", "--plan", str(pair_plan), "--nproc", "2", "--steps", "3",
        "--optimizer", "adamw", "--check", "--report", str(report_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert len(report["loss"]) == 3 and report["loss"][2] < report["loss"][0]
    assert report["world_size"] == 2 and report["mesh"]["shape"] == [2]
    assert report["collectives"]["match"] and report["deviations"] == []
    assert sum(report["collectives"]["measured"].values()) > 0  # the batch is split: data moves
    table_rows = [f"{name:<16}{count:>10}" for name, count in report["collectives"]["measured"].items()]
    assert all(row in run.stdout for row in table_rows) and "collectives: as planned" in run.stdout
    assert "check: loss, gradients and parameters equal one process" in run.stdout


def test_a_plan_from_a_launchers_graph_runs_on_the_launchers_module(tmp_path: Path) -> None:
    """export-graph -> plan --graph (no model code) -> run on the module the graph came from, checked."""
    factory = f"{ROOT / 'tests/strategies/models/user_models/hf_llama.py'}:factory"
    graph, plan = tmp_path / "graph.json", tmp_path / "plan.json"
    exported = command("export-graph", "--model", factory, "-o", str(graph))
    assert exported.returncode == 0, exported.stderr[-3000:]
    planned = command(
        "plan", "--graph", str(graph), "--mesh", "2", "--baseline", "fsdp", "--out", str(plan), "--quiet"
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert json.loads(plan.read_text())["request"]["graph"]["sha256"]
    run = command("run", "--model", factory, "--plan", str(plan), "--nproc", "2", "--check")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "collectives: as planned" in run.stdout
    assert "check: loss, gradients and parameters equal one process" in run.stdout


def test_run_is_a_rank_of_torchrun(pair_plan: Path) -> None:
    """Built on the meta device: each rank makes its own shards, and the check's one-process run is a
    process rank 0 starts."""
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    run = command(
        "run", "--model", "mlp", "--plan", str(pair_plan), "--meta-init", "--check", launcher=launcher
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("collectives: as planned") == 1  # rank 0 prints the report
    assert "check: loss, gradients and parameters equal one process" in run.stdout


def test_weights_that_are_not_there_exit_2_before_any_rank_starts(mlp_plan: Path, tmp_path: Path) -> None:
    run = command("run", "--model", "mlp", "--plan", str(mlp_plan), "--weights", str(tmp_path / "none"))
    assert run.returncode == 2
    assert run.stderr.strip().startswith(f"autoshard: --weights: weights: {tmp_path / 'none'} is neither")


def test_a_plan_for_another_model_exits_2_naming_it_before_any_rank_starts(mlp_plan: Path) -> None:
    run = command("run", "--model", "gpt2-small", "--plan", str(mlp_plan))
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.strip().startswith(
        "autoshard: model: the plan was made for mlp, it does not build gpt2-small: d: not an option"
    )
    assert "rank" not in run.stderr


def test_a_plan_a_rank_refuses_ends_in_its_one_line_without_a_traceback(
    pair_plan: Path, tmp_path: Path
) -> None:
    """The ranks find the fault (an op input no op reads: ``P(mask)``); the launcher's log of their
    traceback is left out, and the last line names the node."""
    plan = json.loads(pair_plan.read_text())
    node = plan["nodes"][0]
    node["inputs"][0] = ["P(mask)"]
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    run = command("run", "--model", "mlp", "--plan", str(path))
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"autoshard: rank \d: plan: node {node['name']} \(.*\): .*P\(mask\).*; plan again", last
    ), last


def test_a_world_size_the_mesh_does_not_have_exits_2_at_once(mlp_plan: Path) -> None:
    run = command("run", "--model", "mlp", "--plan", str(mlp_plan), "--nproc", "2")
    assert run.returncode == 2
    assert run.stderr.strip() == "autoshard: world size: the plan's mesh [2, 2] needs 4 ranks, this run has 2"


def test_a_rank_killed_mid_run_ends_the_run_naming_it(pair_plan: Path) -> None:
    """SIGKILL one rank while the ranks train: the launcher stops the others and the command exits 1
    within seconds, naming the rank, instead of hanging in a collective."""
    args = ["run", "--model", "mlp", "--plan", str(pair_plan), "--steps", "100000"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert launcher.stderr is not None
        deadline = time.monotonic() + 120
        for line in launcher.stderr:  # rank 0's progress: the ranks are training
            if line.startswith("step 2:") or time.monotonic() > deadline:
                break
        ranks = _ranks(launcher.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
        assert time.monotonic() - killed_at < 30
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"autoshard: rank \d failed: Signal 9 \(SIGKILL\) received by PID {ranks[-1]}", last
    ), last


def _ranks(launcher: int) -> list[int]:
    """The ranks of a launcher, in the order started: what its fork server forked (or, where ranks are
    spawned, what it spawned)."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    ranks = []
    for child in children.get(launcher, []):
        if "multiprocessing.forkserver" in commands[child]:
            ranks += children.get(child, [])
        elif "multiprocessing.spawn" in commands[child]:
            ranks.append(child)
    return sorted(ranks)
