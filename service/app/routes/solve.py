"""``POST /v1/solve``: a bare strategy-selection problem in the IOPDDL format, solved as a job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import Response

from service.app.deps import Submitter
from service.app.openapi import json_body
from service.app.schemas import JobOut
from service.app.submission import Services, submit
from service.intake import read_solve
from service.submissions import MAX_TIME_LIMIT_S, Backend

router = APIRouter(prefix="/v1/solve", tags=["solve"])
IOPDDL = {
    "type": "object",
    "description": 'IOPDDL: {"problem": {"name", "nodes": {"intervals", "costs", "usages"}, "edges": '
    '{"nodes", "costs"}, "usage_limit", "groups", "pins"}}; unknown fields are refused',
    "required": ["problem"],
    "additionalProperties": False,
    "properties": {"problem": {"type": "object"}},
}


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    openapi_extra=json_body(IOPDDL),
    responses={
        200: {"description": "the result, solved before (same problem and options)"},
        202: {"description": "a job is working on it: see Location"},
        422: {"description": "the problem is invalid; `field` names what"},
        429: {"description": "the queue, your caps or the checkers are full; see Retry-After"},
    },
)
async def submit_solve(
    request: Request,
    principal: Submitter,
    backend: Annotated[Backend, Query()] = "auto",
    time_limit_s: Annotated[float, Query(gt=0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)] = 30.0,
    gap: Annotated[float, Query(ge=0, le=1, allow_inf_nan=False)] = 0.0,
) -> Response:
    """Solve an IOPDDL problem: the result (``solution``, ``cost``, ``status``, ``bound``, ``gap``,
    ``seconds``) when solved before, else a job."""
    options = {"backend": backend, "time_limit_s": time_limit_s, "gap": gap}
    return await submit(Services.of(request), principal, read_solve, await request.body(), options)
