"""One submission flow for plans and solves: the stored result (200), the job already on it (202), a new
job (202), or a full queue (429 with Retry-After)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, status
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session

from service.app.routes.jobs import job_location, job_out
from service.app.settings import Settings
from service.jobs.metrics import Metrics
from service.store import jobs as job_store
from service.store import plans as plan_store


def stored_result(session: Session, key: str) -> Response | None:
    """The stored result of ``key`` as it was written (no re-encoding), or None."""
    plan = plan_store.get_plan(session, key)
    if plan is None:
        return None
    headers = {"Content-Location": f"/v1/plans/{key}", "X-Autoshard-Hash": key, "X-Autoshard-Cache": "hit"}
    return Response(plan.document, media_type="application/json", headers=headers)


def submit(
    session: Session,
    settings: Settings,
    metrics: Metrics,
    kind: str,
    key: str,
    request: Callable[[], dict[str, Any]],
    time_limit_s: float,
) -> Response:
    """Answer a submission keyed by ``key``; ``request()`` validates (raising BadRequest) and gives what
    the job will run. It is called only on a cache miss."""
    cached = stored_result(session, key)
    if cached is not None:
        metrics.cache_hits.labels(kind).inc()
        return cached
    metrics.cache_misses.labels(kind).inc()
    job = job_store.find_active_job(session, key)
    if job is None:
        document = request()
        if job_store.count_queued(session) >= settings.max_queued_jobs:
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS,
                f"the queue is full ({settings.max_queued_jobs} jobs); retry later",
                headers={"Retry-After": str(settings.retry_after_s)},
            )
        job = job_store.create_job(session, kind, key, document, time_limit_s)
        session.commit()
    body = job_out(job).model_dump(mode="json")
    return JSONResponse(body, status_code=status.HTTP_202_ACCEPTED, headers={"Location": job_location(job)})
