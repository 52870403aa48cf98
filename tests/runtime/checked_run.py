"""A plan run on the shared gloo ranks with `run_rank`'s check, and the assertions every such run makes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.worker import RunOptions, run_rank


def run_checked(ranks: Any, plan: dict[str, Any], model: str, path: Path, **options: Any) -> dict[str, Any]:
    """Two checked AdamW steps (whose state the memory model counts) of ``plan`` on the ranks; rank 0's
    report, after asserting every rank answered, alike, equal to one process and as placed."""
    path.write_text(json.dumps(plan), encoding="utf-8")
    settings = {"steps": 2, "lr": 1e-3, "check": True, "optimizer": "adamw", **options}
    reports = ranks.run(run_rank, RunOptions(model=model, plan=str(path), **settings))
    for rank, report in enumerate(reports):
        assert isinstance(report, dict), f"rank {rank}: {report}"
    assert all(r["loss"] == reports[0]["loss"] for r in reports)
    assert reports[0]["checked"] and reports[0]["deviations"] == []
    return reports[0]


def assert_as_planned(report: dict[str, Any]) -> None:
    """The collectives the plan predicts (kind, count; bytes where gloo has them all) and a peak per rank
    within 110% of the predicted one."""
    collectives = report["collectives"]
    assert collectives["measured"] == collectives["expected_on_backend"], collectives
    if "all_to_all" not in collectives["predicted"]:  # gloo gathers instead: other bytes
        assert collectives["measured_bytes"] == collectives["predicted_bytes"], collectives
    memory = report["memory"]
    assert 0 < max(memory["peak_bytes_per_rank"]) <= 1.1 * memory["predicted_peak_bytes"], memory
