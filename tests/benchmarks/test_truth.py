"""The truth table's held-out pair (`benchmarks/truth.py`): torchtitan's Llama 3 8B FSDP on 8 and 128
H100, which nothing of the cost model was fitted to, predicted within 15% and its per-GPU scaling within 5
points."""

from __future__ import annotations

import yaml

from benchmarks.truth import CASES, RUNS, plan_case

PAIR = ("tt-l3-8b-8gpu-fsdp", "tt-l3-8b-128gpu-fsdp")


def test_torchtitans_fsdp_runs_on_8_and_128_h100_are_predicted_as_published() -> None:
    runs = {run["id"]: run for run in yaml.safe_load(RUNS.read_text())["runs"]}
    small, large = (plan_case(next(c for c in CASES if c.run == run), runs[run]) for run in PAIR)
    for row in (small, large):
        assert not row.error and row.case.role == "held out"
        assert abs(row.relative_error) < 0.15, (row.case.run, row.predicted, row.published)
    published = large.published / small.published - 1  # -2.7%
    predicted = large.predicted / small.predicted - 1
    assert abs(predicted - published) < 0.05, (predicted, published)
