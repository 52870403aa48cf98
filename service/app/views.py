"""Answers built from store rows: a job, a search, and where to poll them."""

from __future__ import annotations

import json
from typing import Any

from service.app.schemas import JobOut, SearchOut
from service.store.models import SEARCH, SUCCEEDED, Job


def job_out(job: Job) -> JobOut:
    return JobOut(
        id=job.id,
        kind=job.kind,  # type: ignore[arg-type]
        state=job.state,  # type: ignore[arg-type]
        problem_hash=job.problem_hash,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempts=job.attempts,
        progress=None if job.progress is None else json.loads(job.progress),
        error=None if job.error is None else json.loads(job.error),
        plan_url=_result_url(job) if job.state == SUCCEEDED else None,
    )


def search_out(job: Job, results: dict[str, Any] | None) -> SearchOut:
    progress = None if job.progress is None else json.loads(job.progress)
    return SearchOut(
        id=job.id,
        state=job.state,  # type: ignore[arg-type]
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        progress=progress if progress is None or progress.get("phase") == "search" else None,  # type: ignore[arg-type]
        error=None if job.error is None else json.loads(job.error),
        results=results,
        report_url=f"/v1/searches/{job.id}/report",
    )


def accepted(job: Job) -> tuple[dict[str, Any], str]:
    """The 202 answer to a submission that made or joined ``job``: its body and Location."""
    if job.kind == SEARCH:
        return search_out(job, None).model_dump(mode="json"), f"/v1/searches/{job.id}"
    return job_out(job).model_dump(mode="json"), job_location(job)


def _result_url(job: Job) -> str:
    return f"/v1/searches/{job.id}" if job.kind == SEARCH else f"/v1/plans/{job.problem_hash}"


def job_location(job: Job) -> str:
    return f"/v1/jobs/{job.id}"
