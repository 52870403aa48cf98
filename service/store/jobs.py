"""Job repository: create, find, list, cancel; the queue's claim, leases and re-queue.

A claim turns the oldest queued job into a running one owned by a worker, with a lease that the worker's
replica renews (heartbeat). On PostgreSQL the candidate row is locked with ``SELECT ... FOR UPDATE SKIP
LOCKED``, so replicas claiming at once take different jobs; on SQLite (one writer at a time) the claim is a
compare-and-set ``UPDATE ... WHERE state = 'queued'`` that only one claimant can win.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.store.models import CANCELED, FAILED, JOB_STATES, QUEUED, RUNNING, SUCCEEDED, Job
from service.store.session import is_postgresql


def create_job(
    session: Session, kind: str, problem_hash: str, request: dict[str, Any], time_limit_s: float
) -> Job:
    job = Job(
        id=str(uuid.uuid4()),
        kind=kind,
        state=QUEUED,
        problem_hash=problem_hash,
        request=json.dumps(request, sort_keys=True),
        time_limit_s=time_limit_s,
        created_at=time.time(),
        attempts=0,
    )
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def find_active_job(session: Session, problem_hash: str) -> Job | None:
    """The queued or running job of ``problem_hash``, if any: a resubmission joins it."""
    query = (
        select(Job)
        .where(Job.problem_hash == problem_hash, Job.state.in_((QUEUED, RUNNING)))
        .order_by(Job.created_at)
        .limit(1)
    )
    return session.scalars(query).first()


def list_jobs(session: Session, state: str | None, limit: int, offset: int) -> tuple[list[Job], int]:
    """A page of jobs, newest first, and the total count (of ``state`` when given)."""
    query = select(Job)
    count = select(func.count()).select_from(Job)
    if state is not None:
        query, count = query.where(Job.state == state), count.where(Job.state == state)
    page = session.scalars(query.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)).all()
    return list(page), int(session.scalar(count) or 0)


def count_queued(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Job).where(Job.state == QUEUED)) or 0)


def counts_by_state(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state)).all()
    counts = dict.fromkeys(JOB_STATES, 0)
    counts.update({state: int(n) for state, n in rows})
    return counts


def cancel_job(session: Session, job_id: str) -> Job | None:
    """Mark a queued or running job canceled (its replica sees it and stops the worker); a finished job
    is left as it is. None when there is no such job."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None:
        return None
    if job.state in (QUEUED, RUNNING):
        job.state = CANCELED
        job.finished_at = time.time()
        job.lease_owner = None
        job.lease_expires_at = None
    return job


def claim_next_job(session: Session, owner: str, lease_s: float) -> Job | None:
    """The oldest queued job, now running under ``owner``'s lease; None when the queue is empty."""
    now = time.time()
    oldest = select(Job.id).where(Job.state == QUEUED).order_by(Job.created_at, Job.id).limit(1)
    if is_postgresql(session.get_bind()):
        job_id = session.scalar(oldest.with_for_update(skip_locked=True))
        if job_id is None:
            return None
        return _take(session, job_id, owner, now, lease_s)
    for _ in range(8):  # SQLite: lost a race to another claimant: try the next oldest
        job_id = session.scalar(oldest)
        if job_id is None:
            return None
        job = _take(session, job_id, owner, now, lease_s)
        if job is not None:
            return job
    return None


def _take(session: Session, job_id: str, owner: str, now: float, lease_s: float) -> Job | None:
    taken = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state == QUEUED)
        .values(
            state=RUNNING,
            lease_owner=owner,
            claimed_by=owner,
            lease_expires_at=now + lease_s,
            started_at=now,
            attempts=Job.attempts + 1,
            progress=None,
        )
        .execution_options(synchronize_session=False)
    )
    if taken.rowcount != 1:
        return None
    return session.get(Job, job_id, populate_existing=True)


def _owned(job_id: str, owner: str) -> Any:
    return (Job.id == job_id) & (Job.state == RUNNING) & (Job.lease_owner == owner)


def renew_lease(session: Session, job_id: str, owner: str, lease_s: float, progress: dict | None) -> bool:
    """Extend ``owner``'s lease (and record progress); False when the job is no longer its own (canceled,
    or re-queued after its lease expired): the worker must stop."""
    values: dict[str, Any] = {"lease_expires_at": time.time() + lease_s}
    if progress is not None:
        values["progress"] = json.dumps(progress)
    result = session.execute(
        update(Job).where(_owned(job_id, owner)).values(**values).execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def finish_job(
    session: Session,
    job_id: str,
    owner: str,
    state: str,
    error: dict | None = None,
    progress: dict | None = None,
) -> bool:
    """Close ``owner``'s running job as succeeded or failed; False when it was no longer its own."""
    assert state in (SUCCEEDED, FAILED)
    values: dict[str, Any] = {
        "state": state,
        "finished_at": time.time(),
        "lease_owner": None,
        "lease_expires_at": None,
        "error": None if error is None else json.dumps(error),
    }
    if progress is not None:
        values["progress"] = json.dumps(progress)
    result = session.execute(
        update(Job).where(_owned(job_id, owner)).values(**values).execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def requeue_expired(session: Session) -> int:
    """Running jobs whose lease ran out (their replica died) go back to the queue; returns how many."""
    result = session.execute(
        update(Job)
        .where(Job.state == RUNNING, Job.lease_expires_at < time.time())
        .values(state=QUEUED, lease_owner=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)


def release_jobs(session: Session, owner: str) -> int:
    """``owner``'s running jobs back to the queue (a replica shutting down); returns how many."""
    result = session.execute(
        update(Job)
        .where(Job.state == RUNNING, Job.lease_owner == owner)
        .values(state=QUEUED, lease_owner=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)
