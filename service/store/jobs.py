"""Job repository: create (one live job per owner and problem), find, list, cancel; the queue's claim,
leases, bounded retries and retention.

A claim turns the oldest queued job into a running one owned by a worker, with a lease that the worker's
replica renews (heartbeat). On PostgreSQL the candidate row is locked with ``SELECT ... FOR UPDATE SKIP
LOCKED``, so replicas claiming at once take different jobs; on SQLite (one writer at a time) the claim is a
compare-and-set ``UPDATE ... WHERE state = 'queued'`` that only one claimant can win.

Every claim counts an attempt. A job whose replica died (its lease expired), whose worker process died or
that could not be handed to a worker goes back to the queue while it has attempts left, and fails with the
reason once it has had ``max_attempts``: no job is re-queued forever.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.models import (
    CANCELED,
    FAILED,
    FINISHED_STATES,
    JOB_STATES,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    Job,
)
from service.store.session import is_postgresql

LIVE_STATES = (QUEUED, RUNNING)


def create_job(
    session: Session,
    kind: str,
    problem_hash: str,
    request: str,
    time_limit_s: float,
    owner: str,
    candidates: int = 1,
) -> tuple[Job, bool]:
    """A new queued job of ``owner`` running ``request`` (JSON text), or the live job of ``owner`` with the
    same ``problem_hash`` when there is one: ``(job, created)``. Identical submissions at once become one
    job (the unique index on live jobs decides which insert wins; the others join it)."""
    for _ in range(3):
        job = Job(
            id=str(uuid.uuid4()),
            kind=kind,
            state=QUEUED,
            problem_hash=problem_hash,
            request=request,
            time_limit_s=time_limit_s,
            created_at=time.time(),
            attempts=0,
            owner=owner,
            candidates=candidates,
        )
        try:
            with session.begin_nested():
                session.add(job)
            return job, True
        except IntegrityError:  # another submission of the same problem won the race: join it
            existing = find_active_job(session, problem_hash, owner)
            if existing is not None:
                return existing, False
    raise RuntimeError(f"could not create or join a job for {problem_hash}")


def get_job(session: Session, job_id: str, owner: str | None = None) -> Job | None:
    """The job ``job_id``; None when there is none or it is not ``owner``'s (None: anyone's)."""
    job = session.get(Job, job_id)
    return job if job is not None and (owner is None or job.owner == owner) else None


def find_active_job(session: Session, problem_hash: str, owner: str) -> Job | None:
    """``owner``'s queued or running job of ``problem_hash``, if any: a resubmission joins it."""
    query = select(Job).where(
        Job.problem_hash == problem_hash, Job.owner == owner, Job.state.in_(LIVE_STATES)
    )
    return session.scalars(query.limit(1)).first()


def list_jobs(
    session: Session, state: str | None, limit: int, offset: int, owner: str | None = None
) -> tuple[list[Job], int]:
    """A page of jobs (``owner``'s; None: everyone's), newest first, and the total count (of ``state`` when
    given)."""
    query = select(Job)
    count = select(func.count()).select_from(Job)
    if state is not None:
        query, count = query.where(Job.state == state), count.where(Job.state == state)
    if owner is not None:
        query, count = query.where(Job.owner == owner), count.where(Job.owner == owner)
    page = session.scalars(query.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)).all()
    return list(page), int(session.scalar(count) or 0)


def count_live(session: Session) -> int:
    """Queued and running jobs of every owner: the queue's bound counts both."""
    return int(session.scalar(select(func.count()).select_from(Job).where(Job.state.in_(LIVE_STATES))) or 0)


def live_work(session: Session, owner: str) -> tuple[float, int]:
    """Solver seconds and candidates that ``owner``'s queued and running jobs ask for."""
    row = session.execute(
        select(
            func.coalesce(func.sum(Job.time_limit_s), 0.0), func.coalesce(func.sum(Job.candidates), 0)
        ).where(Job.owner == owner, Job.state.in_(LIVE_STATES))
    ).one()
    return float(row[0]), int(row[1])


def counts_by_state(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state)).all()
    counts = dict.fromkeys(JOB_STATES, 0)
    counts.update({state: int(n) for state, n in rows})
    return counts


def cancel_job(session: Session, job_id: str, owner: str | None = None) -> Job | None:
    """Mark a queued or running job canceled (its replica sees it and stops the worker); a finished job
    is left as it is. None when there is no such job of ``owner`` (None: anyone's)."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None or (owner is not None and job.owner != owner):
        return None
    if job.state in LIVE_STATES:
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


def retry_or_fail(session: Session, job_id: str, owner: str, reason: str, max_attempts: int) -> str | None:
    """``owner``'s running job could not be run (its worker died, it could not be handed over): back to the
    queue while it has attempts left, else failed with ``reason``. The state it is left in; None when it was
    no longer ``owner``'s."""
    job = session.get(Job, job_id, populate_existing=True)
    if job is None or job.state != RUNNING or job.lease_owner != owner:
        return None
    if job.attempts < max_attempts:
        job.state, job.lease_owner, job.lease_expires_at = QUEUED, None, None
        return QUEUED
    finish_job(session, job_id, owner, FAILED, _gave_up(job.attempts, reason))
    return FAILED


def expire_leases(session: Session, max_attempts: int) -> tuple[int, int]:
    """Running jobs whose lease ran out (their replica died): back to the queue while they have attempts
    left, failed after ``max_attempts``. Returns (re-queued, failed)."""
    expired = (Job.state == RUNNING) & (Job.lease_expires_at < time.time())
    failed = 0
    for job in session.scalars(select(Job).where(expired, Job.attempts >= max_attempts)).all():
        reason = "its replica stopped renewing its lease (it died or lost the database)"
        job.state, job.finished_at = FAILED, time.time()
        job.lease_owner = job.lease_expires_at = None
        job.error = json.dumps(_gave_up(job.attempts, reason))
        failed += 1
    session.flush()
    requeued = session.execute(
        update(Job)
        .where(expired, Job.attempts < max_attempts)
        .values(state=QUEUED, lease_owner=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    return int(requeued.rowcount or 0), failed


def _gave_up(attempts: int, reason: str) -> dict[str, str]:
    return {"type": "gave_up", "message": f"not run after {attempts} attempt(s): {reason}"}


def release_jobs(session: Session, owner: str) -> int:
    """``owner``'s running jobs back to the queue (a replica shutting down): the attempt is not counted
    against the job. Returns how many."""
    result = session.execute(
        update(Job)
        .where(Job.state == RUNNING, Job.lease_owner == owner)
        .values(state=QUEUED, lease_owner=None, lease_expires_at=None, attempts=Job.attempts - 1)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)


def delete_finished(session: Session, before: float) -> list[tuple[str, str]]:
    """Delete the jobs (and their stored requests) that finished before ``before``; their (id, kind)."""
    finished = Job.state.in_(FINISHED_STATES) & (func.coalesce(Job.finished_at, Job.created_at) < before)
    gone = [(job_id, kind) for job_id, kind in session.execute(select(Job.id, Job.kind).where(finished))]
    if gone:
        session.execute(delete(Job).where(finished).execution_options(synchronize_session=False))
    return gone
