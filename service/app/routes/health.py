"""``/healthz`` (the process answers), ``/readyz`` (store reachable and migrated, a solver worker up, the
checkers started: open as a bare status; its details, with host names and process ids, need the ``metrics``
scope), ``/metrics`` (Prometheus, ``metrics`` scope)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.access import METRICS
from service.app.deps import MaybePrincipal, MetricsDep, Monitor, SettingsDep, StoreDep
from service.store.migrate import is_at_head

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Answered in the event loop itself: it is slow only when the loop is."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready; `problems` says why (with details)"}})
def readyz(
    request: Request, store: StoreDep, settings: SettingsDep, principal: MaybePrincipal
) -> JSONResponse:
    """``{"status": "ready" | "not ready"}`` for anyone (a load balancer's probe); with a token of the
    ``metrics`` scope also the problems and the worker processes."""
    problems = []
    try:
        with store.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        if not is_at_head(store.engine, store.url):
            problems.append("store: migrations are not at head")
    except Exception as error:
        problems.append(f"store: unreachable ({type(error).__name__})")
    runner = request.app.state.runner
    if settings.workers > 0 and runner.ready_workers == 0:
        problems.append("workers: no solver worker is ready")
    checker = request.app.state.checker
    if not checker.ready:
        problems.append("checkers: still starting")
    body: dict[str, object] = {"status": "ready" if not problems else "not ready"}
    if principal is not None and principal.may(METRICS):
        body.update(
            problems=problems,
            workers_ready=runner.ready_workers,
            worker_processes=runner.worker_states(),
            workers=settings.workers,
            checkers_ready=checker.ready,
        )
    return JSONResponse(body, status_code=200 if not problems else 503)


@router.get("/metrics")
def metrics(metrics: MetricsDep, _principal: Monitor) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
