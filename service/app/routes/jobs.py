"""``/v1/jobs``: the state and progress of plans and solves being worked on; DELETE cancels."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from service.app.deps import CanRead, CanSubmit, SessionDep
from service.app.schemas import JobOut, JobPage, JobState
from service.store import jobs as job_store
from service.store.models import SEARCH, SUCCEEDED, Job

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
JobId = Annotated[str, Path(min_length=1, max_length=36, description="the job's id")]


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


def _result_url(job: Job) -> str:
    return f"/v1/searches/{job.id}" if job.kind == SEARCH else f"/v1/plans/{job.problem_hash}"


def job_location(job: Job) -> str:
    return f"/v1/jobs/{job.id}"


@router.get("", dependencies=[CanRead])
def list_jobs(
    session: SessionDep,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> JobPage:
    """Jobs, newest first, a page at a time."""
    jobs, total = job_store.list_jobs(session, state, limit, offset)
    return JobPage(items=[job_out(job) for job in jobs], total=total, limit=limit, offset=offset)


@router.get("/{job_id}", dependencies=[CanRead], responses={404: {"description": "no such job"}})
def get_job(job_id: JobId, session: SessionDep) -> JobOut:
    """A job: state, progress (phase, incumbent, bound, gap, elapsed), the error, the result's URL."""
    job = job_store.get_job(session, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    return job_out(job)


@router.delete("/{job_id}", dependencies=[CanSubmit], responses={404: {"description": "no such job"}})
def cancel_job(job_id: JobId, session: SessionDep) -> JobOut:
    """Cancel a queued or running job (its worker process is stopped); a finished job is returned as is."""
    job = job_store.cancel_job(session, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    session.commit()
    return job_out(job)
