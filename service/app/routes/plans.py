"""``/v1/plans``: submit a planning problem (200 with the stored plan, or 202 and a job); read a plan by
its problem hash; explain one of its placements."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from service import planning
from service.app.deps import CanRead, CanSubmit, MetricsDep, PlanCacheDep, SettingsDep, StoreDep
from service.app.schemas import JobOut, PlanSubmission
from service.app.submission import cached_result, stored_result, submit
from service.planning import BadRequest
from service.store import plans as plan_store

router = APIRouter(prefix="/v1/plans", tags=["plans"])
ProblemHash = Annotated[str, Path(pattern="^[0-9a-f]{64}$", description="the problem's content hash")]
EXPLAIN_TIMEOUT_S = 120.0


@router.post(
    "",
    dependencies=[CanSubmit],
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses={
        200: {"description": "the plan, solved before (the same problem hash)"},
        202: {"description": "a job is working on it: see Location"},
        413: {"description": "the body is too large"},
        422: {"description": "the request is invalid; `field` names what"},
        429: {"description": "the queue is full; see Retry-After"},
    },
)
async def submit_plan(
    body: PlanSubmission, store: StoreDep, cache: PlanCacheDep, settings: SettingsDep, metrics: MetricsDep
) -> Response:
    """Plan a model on a mesh. The answer is the plan itself when this problem was solved before, else a
    job to poll at ``Location``."""
    request = planning.canonical_plan_request(body)
    key = planning.plan_hash(request)

    def validated() -> dict[str, Any]:
        planning.validate_plan(request, settings.max_graph_bytes, settings.max_time_limit_s)
        return request

    return await submit(store, cache, settings, metrics, "plan", key, validated, body.solver.time_limit_s)


@router.get("/{problem_hash}", dependencies=[CanRead], responses={404: {"description": "no such plan"}})
async def get_plan(problem_hash: ProblemHash, store: StoreDep, cache: PlanCacheDep) -> Response:
    """A stored result by problem hash: a plan JSON (or the result of a bare solve)."""
    stored = cached_result(cache, problem_hash) or await run_in_threadpool(
        stored_result, store, cache, problem_hash
    )
    if stored is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no plan {problem_hash}")
    return stored


@router.get(
    "/{problem_hash}/explain",
    dependencies=[CanRead],
    responses={404: {"description": "no such plan"}, 422: {"description": "unknown target"}},
)
async def explain_plan(
    problem_hash: ProblemHash,
    target: Annotated[
        str, Query(min_length=1, max_length=256, description="a parameter, NAME.grad or a node")
    ],
    request: Request,
    store: StoreDep,
) -> dict[str, Any]:
    """Why the plan placed ``target`` so: its cost (compute, communication in and out) and the next-best
    alternatives; computed in a separate process."""
    with store.session() as session:
        plan = plan_store.get_plan(session, problem_hash)
        kind, document = (None, None) if plan is None else (plan.kind, plan.document)
    if document is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no plan {problem_hash}")
    if kind != "plan":
        raise BadRequest("problem_hash", "a bare solve has no placements to explain")
    from service.explaining import explain_or_error

    pool = request.app.state.explain_pool()
    future = pool.submit(explain_or_error, json.loads(document), target)
    try:
        report = await asyncio.wait_for(asyncio.wrap_future(future), EXPLAIN_TIMEOUT_S)
    except TimeoutError as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "explain took too long") from error
    if "unknown_target" in report:
        raise BadRequest("target", report["unknown_target"])
    return report
