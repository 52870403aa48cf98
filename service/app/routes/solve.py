"""``POST /v1/solve``: a bare strategy-selection problem in the IOPDDL format, solved as a job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, status
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from service import planning
from service.app.deps import CanSubmit, MetricsDep, PlanCacheDep, SettingsDep, StoreDep
from service.app.schemas import Backend, JobOut
from service.app.submission import submit
from service.planning import BadRequest

router = APIRouter(prefix="/v1/solve", tags=["solve"])


@router.post(
    "",
    dependencies=[CanSubmit],
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses={
        200: {"description": "the result, solved before (same problem and options)"},
        202: {"description": "a job is working on it: see Location"},
        422: {"description": "the problem is invalid; `field` names what"},
        429: {"description": "the queue is full; see Retry-After"},
    },
)
async def submit_solve(
    document: Annotated[
        dict[str, Any], Body(description='IOPDDL: {"problem": {"nodes": ..., "edges": ...}}')
    ],
    store: StoreDep,
    cache: PlanCacheDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    backend: Annotated[Backend, Query()] = "auto",
    time_limit_s: Annotated[float, Query(gt=0)] = 30.0,
    gap: Annotated[float, Query(ge=0, le=1)] = 0.0,
) -> Response:
    """Solve an IOPDDL problem: the result (``solution``, ``cost``, ``status``, ``bound``, ``gap``,
    ``seconds``) when solved before, else a job."""
    if time_limit_s > settings.max_time_limit_s:
        raise BadRequest("time_limit_s", f"at most {settings.max_time_limit_s:g} s")
    problem = await run_in_threadpool(planning.validate_solve, document)
    options = {"backend": backend, "time_limit_s": time_limit_s, "gap": gap}
    key = planning.solve_hash(problem.content_hash, options)
    return await submit(
        store,
        cache,
        settings,
        metrics,
        "solve",
        key,
        lambda: {"problem": document, "options": options},
        time_limit_s,
    )
