"""``/v1/jobs``: the state and progress of a principal's plans, solves and searches; DELETE cancels. A job
of another principal is answered 404 (an ``admin`` token sees and cancels every job)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from service.app.deps import Reader, SessionDep, Submitter
from service.app.schemas import JobOut, JobPage, JobState
from service.app.views import job_out
from service.store import jobs as job_store

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
JobId = Annotated[str, Path(min_length=1, max_length=36, description="the job's id")]


@router.get("")
def list_jobs(
    session: SessionDep,
    principal: Reader,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
) -> JobPage:
    """This principal's jobs, newest first, a page at a time."""
    jobs, total = job_store.list_jobs(session, state, limit, offset, principal.owner_filter)
    return JobPage(items=[job_out(job) for job in jobs], total=total, limit=limit, offset=offset)


@router.get("/{job_id}", responses={404: {"description": "no such job"}})
def get_job(job_id: JobId, session: SessionDep, principal: Reader) -> JobOut:
    """A job: state, progress (phase, incumbent, bound, gap, elapsed), the error, the result's URL."""
    job = job_store.get_job(session, job_id, principal.owner_filter)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    return job_out(job)


@router.delete("/{job_id}", responses={404: {"description": "no such job"}})
def cancel_job(job_id: JobId, session: SessionDep, principal: Submitter) -> JobOut:
    """Cancel a queued or running job (its worker process is stopped); a finished job is returned as is."""
    job = job_store.cancel_job(session, job_id, principal.owner_filter)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}")
    session.commit()
    return job_out(job)
