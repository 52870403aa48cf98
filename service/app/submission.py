"""One submission flow for plans, solves and searches: the body read (in the event loop when small, by a
checker process when large), then the stored result (200), the principal's job already on it (202), or,
once the full check passed and the caps allow it, a new job (202); 429 with Retry-After when the queue, the
principal's caps or the checkers are full. A cached result is answered without leaving the event loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request, status
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.access import Principal
from service.app.checker import Checker
from service.app.errors import too_busy
from service.app.views import accepted
from service.intake import SEARCH, Intake, check_caps
from service.jobs.metrics import Metrics
from service.settings import Settings
from service.store import jobs as job_store
from service.store import plans as plan_store
from service.store.plan_cache import PlanCache
from service.store.session import Store


@dataclass
class Services:
    """What the submission flow uses, from the app's state."""

    store: Store
    cache: PlanCache
    settings: Settings
    metrics: Metrics
    checker: Checker

    @classmethod
    def of(cls, request: Request) -> Services:
        state = request.app.state
        return cls(state.store, state.plan_cache, state.settings, state.metrics, state.checker)


def cached_result(cache: PlanCache, key: str, principal: Principal) -> Response | None:
    entry = cache.get(key, principal.owner_filter)
    if entry is None:
        return None
    headers = {"Content-Location": f"/v1/plans/{key}", "X-Autoshard-Hash": key, "X-Autoshard-Kind": entry[0]}
    return Response(entry[1], media_type="application/json", headers=headers)


def stored_result(store: Store, cache: PlanCache, key: str, principal: Principal) -> Response | None:
    """The stored result of ``key`` as it was written (no re-encoding) if ``principal`` may read it, else
    None; read from the database once, then from memory."""
    found = cached_result(cache, key, principal)
    if found is not None:
        return found
    with store.new_session() as session:
        plan = plan_store.get_plan(session, key, principal.owner_filter)
        if plan is None:
            return None
        cache.put(key, plan.kind, plan.document, principal.owner_filter)
    return cached_result(cache, key, principal)


async def submit(
    services: Services, principal: Principal, reader: Callable[..., Intake], body: bytes, *args: Any
) -> Response:
    """Answer a submission: ``reader(body, *args)`` reads it (raising BadRequest), the full check runs only
    when neither a readable result nor the principal's live job exists."""
    intake = await services.checker.read(reader, body, *args)
    check_caps(intake, services.checker.limits)
    answer = None if intake.kind == SEARCH else cached_result(services.cache, intake.key, principal)
    if answer is None:
        answer = await run_in_threadpool(_existing, services, principal, intake)
    if answer is None:
        await run_in_threadpool(_room_for, services, principal, intake)
        await services.checker.check(intake)
        answer = await run_in_threadpool(_create, services, principal, intake)
    counter = services.metrics.cache_hits if answer.status_code == 200 else services.metrics.cache_misses
    counter.labels(intake.kind).inc()
    return answer


def _existing(services: Services, principal: Principal, intake: Intake) -> Response | None:
    if intake.kind != SEARCH:
        stored = stored_result(services.store, services.cache, intake.key, principal)
        if stored is not None:
            return stored
    with services.store.new_session() as session:
        job = job_store.find_active_job(session, intake.key, principal.name)
        return None if job is None else _accepted(job)


def _room_for(services: Services, principal: Principal, intake: Intake) -> None:
    with services.store.new_session() as session:
        _check_room(session, services.settings, principal, intake, counted=False)


def _create(services: Services, principal: Principal, intake: Intake) -> Response:
    with services.store.new_session() as session:
        job, created = job_store.create_job(
            session,
            intake.kind,
            intake.key,
            intake.request,
            intake.solver_s,
            principal.name,
            intake.candidates,
        )
        if created:
            try:
                _check_room(session, services.settings, principal, intake, counted=True)
            except HTTPException:
                session.rollback()
                raise
        session.commit()
        return _accepted(job)


def _check_room(
    session: Session, settings: Settings, principal: Principal, intake: Intake, counted: bool
) -> None:
    """429 when the queue (queued and running jobs of everyone) or the principal's live work (solver
    seconds, candidates) would pass its cap with ``intake`` (already ``counted`` among them, or not)."""
    extra = 0 if counted else 1
    live = job_store.count_live(session) + extra
    if live > settings.max_live_jobs:
        _busy(settings, f"the queue is full ({settings.max_live_jobs} jobs queued or running); retry later")
    solver_s, candidates = job_store.live_work(session, principal.name)
    solver_s += 0 if counted else intake.solver_s
    candidates += 0 if counted else intake.candidates
    if solver_s > settings.max_principal_solver_s:
        _busy(
            settings,
            f"your queued and running jobs would ask for {solver_s:g} solver seconds, more than the "
            f"{settings.max_principal_solver_s:g} allowed one principal; retry when some have finished",
        )
    if candidates > settings.max_principal_candidates:
        _busy(
            settings,
            f"your queued and running jobs would plan {candidates} candidates, more than the "
            f"{settings.max_principal_candidates} allowed one principal; retry when some have finished",
        )


def _busy(settings: Settings, message: str) -> None:
    raise too_busy(message, settings.retry_after_s)


def _accepted(job: Any) -> Response:
    body, location = accepted(job)
    return JSONResponse(body, status_code=status.HTTP_202_ACCEPTED, headers={"Location": location})
