"""`autoshard solve`: result JSON on stdout, progress on stderr, exit codes 0 / 2 / 3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bundled_data import EXAMPLE


def autoshard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_solve_prints_the_result_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    run = autoshard("solve", str(EXAMPLE), "--backend", "highs", "--time-limit", "10", "--out", str(out))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["solution"] == [0, 0, 2, 1, 0]
    assert result["cost"] == 445
    assert result["status"] == "optimal"
    assert result["bound"] == 445 and result["gap"] == 0
    assert result["seconds"] > 0
    for key in ("first_solution_seconds", "variables", "constraints", "reductions"):
        assert key in result
    assert json.loads(out.read_text()) == result
    assert "incumbent" in run.stderr


@pytest.mark.parametrize("backend", ["cbc", "cpsat", "heuristic", "auto"])
def test_every_backend_solves_the_example(backend: str) -> None:
    run = autoshard("solve", str(EXAMPLE), "--backend", backend, "--time-limit", "5", "--quiet")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["cost"] == 445
    assert run.stderr == ""


def test_infeasible_limit_exits_3_and_names_the_smallest_peak(tmp_path: Path) -> None:
    document = json.loads(EXAMPLE.read_text())
    document["problem"]["usage_limit"] = 30
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(document))
    run = autoshard("solve", str(path), "--quiet")
    assert run.returncode == 3
    assert "smallest peak any assignment can reach is 50" in run.stderr
    assert json.loads(run.stdout)["status"] == "infeasible"


def test_bad_input_exits_2_and_names_the_field(tmp_path: Path) -> None:
    document = json.loads(EXAMPLE.read_text())
    document["problem"]["edges"]["costs"][1] = [1, 2]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    run = autoshard("solve", str(path))
    assert run.returncode == 2
    assert "problem.edges.costs[1]" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["solve", "/nonexistent/problem.json"],
        ["solve", str(EXAMPLE), "--backend", "gurobi"],
    ],
)
def test_missing_file_and_unknown_backend_exit_2(args: list[str]) -> None:
    run = autoshard(*args)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
