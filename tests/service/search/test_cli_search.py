"""``autoshard search`` as a user runs it: the candidate count, the ranking table, the files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

AUTOSHARD = [sys.executable, "-m", "service.cli"]
SMALL = ["--model", "mlp", "--devices", "4", "--options", '{"d": 64, "h": 128}', "--workers", "2"]


def test_the_command_prints_the_count_and_the_ranking_and_writes_the_files(tmp_path: Path) -> None:
    done = subprocess.run(
        [*AUTOSHARD, "search", *SMALL, "--batch-sizes", "64,128", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "autoshard search: 4 candidates" in done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["candidates"]) == 4
    best = results["candidates"][0]
    assert best["rank"] == 1
    assert any(line.startswith(f"│    1 │ {best['id']} │") for line in done.stdout.splitlines()), done.stdout
    statuses = [row["status"] for row in results["candidates"]]
    counts = ", ".join(f"{statuses.count(status)} {status}" for status in dict.fromkeys(statuses))
    assert f"{counts}; results in {tmp_path / 'results.json'}" in done.stdout
    assert (tmp_path / "results.csv").read_text().count("\n") == 5
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_bad_batch_sizes_are_refused_naming_the_option(tmp_path: Path) -> None:
    done = subprocess.run(
        [*AUTOSHARD, "search", *SMALL, "--batch-sizes", "8,x", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--batch-sizes" in done.stderr
    assert not (tmp_path / "results.json").exists()


def test_mixed_precision_searches_with_every_candidate_in_it(tmp_path: Path) -> None:
    mixed = ["--param-dtype", "float32", "--compute-dtype", "bfloat16", "--batch-sizes", "64"]
    small = [*SMALL[:3], "2", *SMALL[4:]]  # two devices
    done = subprocess.run(
        [*AUTOSHARD, "search", *small, *mixed, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["request"]["dtype"], results["request"]["compute_dtype"]) == ("float32", "bfloat16")
    bad = subprocess.run(
        [*AUTOSHARD, "search", *small, "--compute-dtype", "bfloat17", "--out", str(tmp_path / "bad")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "compute_dtype: unknown 'bfloat17'" in bad.stderr
