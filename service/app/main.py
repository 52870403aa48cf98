"""The app factory: routes, error handlers, middleware, and a lifespan that migrates the store and runs the
replica's job runner."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.app.checker import Checker
from service.app.errors import install_error_handlers
from service.app.explain import Explainer
from service.app.middleware import BodyLimit, RequestTimer
from service.app.openapi import install_body_schemas
from service.app.routes import hardware, health, jobs, models, plans, searches, solve
from service.jobs.metrics import Metrics
from service.jobs.runner import JobRunner
from service.settings import Settings, get_settings
from service.store import jobs as job_store
from service.store.migrate import upgrade_to_head
from service.store.plan_cache import PlanCache
from service.store.session import Store

log = logging.getLogger("autoshard.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upgrade_to_head(settings.database_url)
        store = Store(settings.database_url)
        app.state.store = store
        metrics.watch_store(lambda: _counts(store))
        runner = JobRunner(settings, store, metrics, app.state.plan_cache)
        app.state.runner = runner
        runner.start()
        app.state.checker.start()
        threading.Thread(target=_preload_validation, name="preload", daemon=True).start()
        log.info(
            "autoshard service: %d worker(s), %d checker(s), store %s",
            settings.workers,
            settings.check_workers,
            store.engine.url.render_as_string(),
        )
        try:
            yield
        finally:
            runner.shutdown()
            app.state.checker.close()
            app.state.explainer.close()
            store.dispose()

    app = FastAPI(
        title="autoshard",
        version="1",
        summary="Sharding plans for PyTorch training steps, solved as integer programs, cached by hash.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.plan_cache = PlanCache(settings.plan_cache_bytes)
    app.state.checker = Checker(settings)
    app.state.explainer = Explainer(settings)
    routers = (plans, searches, jobs, solve, models, hardware, health)
    for router in (module.router for module in routers):
        app.include_router(router)
    install_body_schemas(app)
    install_error_handlers(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestTimer, metrics=metrics)
    return app


def _preload_validation() -> None:
    """Import what reading a submission in the API process needs before the first one comes."""
    import service.intake
    import service.search.candidates  # noqa: F401
    import solver.iopddl  # noqa: F401


def _counts(store: Store) -> dict[str, int]:
    with store.session() as session:
        return job_store.counts_by_state(session)
