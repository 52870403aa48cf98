"""``/healthz`` (the process answers), ``/readyz`` (store reachable and migrated, a solver worker up),
``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.app.deps import MetricsDep, SettingsDep, StoreDep
from service.store.migrate import is_at_head

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "not ready; `problems` says why"}})
def readyz(request: Request, store: StoreDep, settings: SettingsDep) -> JSONResponse:
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
    body = {
        "status": "ready" if not problems else "not ready",
        "problems": problems,
        "workers_ready": runner.ready_workers,
        "worker_processes": runner.worker_states(),
        "workers": settings.workers,
    }
    return JSONResponse(body, status_code=200 if not problems else 503)


@router.get("/metrics")
def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
