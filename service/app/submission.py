"""One submission flow for plans and solves: the stored result (200), the job already on it (202), a new
job (202), or a full queue (429 with Retry-After). A stored result in the memory cache is answered without
leaving the event loop; everything else runs in the thread pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, status
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from service.app.routes.jobs import job_location, job_out
from service.app.settings import Settings
from service.jobs.metrics import Metrics
from service.store import jobs as job_store
from service.store import plans as plan_store
from service.store.plan_cache import PlanCache
from service.store.session import Store


def cached_result(cache: PlanCache, key: str) -> Response | None:
    entry = cache.get(key)
    if entry is None:
        return None
    headers = {"Content-Location": f"/v1/plans/{key}", "X-Autoshard-Hash": key, "X-Autoshard-Kind": entry[0]}
    return Response(entry[1], media_type="application/json", headers=headers)


def stored_result(store: Store, cache: PlanCache, key: str) -> Response | None:
    """The stored result of ``key`` as it was written (no re-encoding), or None; read from the database
    once, then from memory."""
    found = cached_result(cache, key)
    if found is not None:
        return found
    with store.new_session() as session:
        plan = plan_store.get_plan(session, key)
        if plan is None:
            return None
        cache.put(key, plan.kind, plan.document)
    return cached_result(cache, key)


async def submit(
    store: Store,
    cache: PlanCache,
    settings: Settings,
    metrics: Metrics,
    kind: str,
    key: str,
    request: Callable[[], dict[str, Any]],
    time_limit_s: float,
) -> Response:
    """Answer a submission keyed by ``key``; ``request()`` validates (raising BadRequest) and gives what
    the job will run. It is called only when neither a result nor a job exists."""
    answer = cached_result(cache, key)
    if answer is None:
        answer = await run_in_threadpool(_submit, store, cache, settings, kind, key, request, time_limit_s)
    (metrics.cache_hits if answer.status_code == 200 else metrics.cache_misses).labels(kind).inc()
    return answer


def _submit(
    store: Store,
    cache: PlanCache,
    settings: Settings,
    kind: str,
    key: str,
    request: Callable[[], dict[str, Any]],
    time_limit_s: float,
) -> Response:
    stored = stored_result(store, cache, key)
    if stored is not None:
        return stored
    with store.new_session() as session:
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
