"""``/v1/plans``: submit a planning problem (200 with the stored plan, or 202 and a job); read a plan by
its problem hash; explain one of its placements."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from service.app.deps import PlanCacheDep, Reader, StoreDep, Submitter
from service.app.explain import explain
from service.app.openapi import json_body
from service.app.schemas import JobOut
from service.app.submission import Services, cached_result, stored_result, submit
from service.intake import read_plan
from service.store import plans as plan_store
from service.submissions import BadRequest, PlanSubmission

router = APIRouter(prefix="/v1/plans", tags=["plans"])
ProblemHash = Annotated[str, Path(pattern="^[0-9a-f]{64}$", description="the problem's content hash")]


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    openapi_extra=json_body(PlanSubmission),
    responses={
        200: {"description": "the plan, solved before (the same problem hash)"},
        202: {"description": "a job is working on it: see Location"},
        413: {"description": "the body is too large"},
        422: {"description": "the request is invalid; `field` names what"},
        429: {"description": "the queue, your caps or the checkers are full; see Retry-After"},
    },
)
async def submit_plan(request: Request, principal: Submitter) -> Response:
    """Plan a model on a mesh (body: PlanSubmission). The answer is the plan itself when this problem was
    solved before for this principal, else a job to poll at ``Location``."""
    return await submit(Services.of(request), principal, read_plan, await request.body())


@router.get("/{problem_hash}", responses={404: {"description": "no such plan"}})
async def get_plan(
    problem_hash: ProblemHash, principal: Reader, store: StoreDep, cache: PlanCacheDep
) -> Response:
    """A stored result by problem hash: a plan JSON (or the result of a bare solve); 404 for one this
    principal may not read."""
    stored = cached_result(cache, problem_hash, principal) or await run_in_threadpool(
        stored_result, store, cache, problem_hash, principal
    )
    if stored is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no plan {problem_hash}")
    return stored


@router.get(
    "/{problem_hash}/explain",
    responses={
        404: {"description": "no such plan"},
        422: {"description": "unknown target"},
        429: {"description": "too many explain requests at once"},
    },
)
async def explain_plan(
    problem_hash: ProblemHash,
    target: Annotated[
        str, Query(min_length=1, max_length=256, description="a parameter, NAME.grad or a node")
    ],
    request: Request,
    principal: Reader,
    store: StoreDep,
) -> dict[str, Any]:
    """Why the plan placed ``target`` so: its cost (compute, communication in and out) and the next-best
    alternatives; computed in a separate process."""
    plan = await run_in_threadpool(_stored, store, problem_hash, principal.owner_filter)
    if plan is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no plan {problem_hash}")
    kind, document = plan
    if kind != "plan":
        raise BadRequest("problem_hash", "a bare solve has no placements to explain")
    return await explain(request.app.state.explainer, problem_hash, document, target)


def _stored(store: Any, problem_hash: str, reader: str | None) -> tuple[str, str] | None:
    with store.session() as session:
        plan = plan_store.get_plan(session, problem_hash, reader)
        return None if plan is None else (plan.kind, plan.document)
