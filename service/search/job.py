"""A search run as a service job: in the job's worker process, its candidates one after the other (or on
Ray when the service's environment names a cluster with ``RAY_ADDRESS``), plans shared with the service's
plan cache, progress reported as it goes. The service's parallelism is its worker slots and replicas: a
worker process is a daemon and may not start a pool of its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.search.executors import InlineExecutor, RayExecutor
from service.search.report.page import write_report
from service.search.results import has_plan
from service.search.task import UNPLANNED
from service.submissions import search_request

SEARCH_PHASE = "search"


def run_search_job(
    body: dict[str, Any],
    out: Path,
    cache_url: str | None,
    report: Callable[[dict[str, Any]], None] | None,
    owner: str,
) -> dict[str, Any]:
    """Run the search of a validated ``POST /v1/searches`` ``body`` (one worker: the job's process) writing
    its files under ``out``, sharing plans with ``owner``'s; the results document."""
    from service.search.runner import run_search

    request = search_request(body, executor="ray" if _ray_address() else "local", workers=1)
    listener = JobProgress(report)
    executor = RayExecutor() if _ray_address() else InlineExecutor()
    results = run_search(request, out, listener, cache_url=cache_url, executor=executor, cache_reader=owner)
    write_report(results, out)
    return results


class JobProgress:
    """The runner's events as the job's progress: ``{"phase": "search", "done", "total", "planned",
    "infeasible", "pruned", "failed", "skipped", "best", "elapsed_s"}`` (``best``: the fastest candidate so
    far, or null)."""

    def __init__(self, report: Callable[[dict[str, Any]], None] | None) -> None:
        self.report = report
        self.started_at = time.perf_counter()
        self.record: dict[str, Any] = {"phase": SEARCH_PHASE, "done": 0, "total": 0, "planned": 0,
                                       **dict.fromkeys(UNPLANNED, 0), "best": None}  # fmt: skip

    def started(self, total: int, reused: int) -> None:
        self.record.update(total=total, reused=reused)
        self._send()

    def finished(self, row: dict[str, Any]) -> None:
        record = self.record
        record["done"] += 1
        if has_plan(row):
            record["planned"] += 1
            best = record["best"]
            if best is None or row["samples_per_s"] > best["samples_per_s"]:
                record["best"] = {
                    name: row[name]
                    for name in (
                        "id",
                        "mesh",
                        "axis_names",
                        "batch",
                        "step_time_s",
                        "samples_per_s",
                        "tokens_per_s",
                    )
                }
        elif row["status"] in UNPLANNED:
            record[row["status"]] += 1
        self._send()

    def _send(self) -> None:
        if self.report is not None:
            self.report({**self.record, "elapsed_s": round(time.perf_counter() - self.started_at, 3)})


def _ray_address() -> str | None:
    import os

    return os.environ.get("RAY_ADDRESS") or None
