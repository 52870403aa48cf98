"""The app factory: routes, error handlers, middleware, and a lifespan that migrates the store and runs the
replica's job runner."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.app.errors import install_error_handlers
from service.app.middleware import BodyLimit, RequestTimer
from service.app.routes import hardware, health, jobs, models, plans, searches, solve
from service.app.settings import Settings, get_settings
from service.jobs.metrics import Metrics
from service.jobs.runner import JobRunner
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
        runner = JobRunner(settings, store, metrics)
        app.state.runner = runner
        runner.start()
        threading.Thread(target=_preload_validation, name="preload", daemon=True).start()
        log.info(
            "autoshard service: %d worker(s), store %s", settings.workers, store.engine.url.render_as_string()
        )
        try:
            yield
        finally:
            runner.shutdown()
            app.state.close_explain_pool()
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
    _explain_pool(app)
    routers = (plans, searches, jobs, solve, models, hardware, health)
    for router in (module.router for module in routers):
        app.include_router(router)
    install_error_handlers(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestTimer, metrics=metrics)
    return app


def _preload_validation() -> None:
    """Import what validating a submission needs (torch: about a second) before the first one comes."""
    import solver.iopddl  # noqa: F401
    import strategies.cost.mesh
    import strategies.models  # noqa: F401


def _counts(store: Store) -> dict[str, int]:
    with store.session() as session:
        return job_store.counts_by_state(session)


def _explain_pool(app: FastAPI) -> None:
    """One explain process, started on first use (it imports torch)."""
    pool: list[ProcessPoolExecutor] = []

    def get() -> ProcessPoolExecutor:
        if not pool:
            pool.append(ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")))
        return pool[0]

    def close() -> None:
        for executor in pool:
            executor.shutdown(wait=False, cancel_futures=True)

    app.state.explain_pool = get
    app.state.close_explain_pool = close
