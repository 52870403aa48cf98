"""``/v1/searches``: run ``autoshard search`` as a job (202 and its Location); read its progress and
results; its HTML report once done. A principal sees its own searches (an ``admin`` every one)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response

from service.access import Principal
from service.app.deps import Reader, SessionDep, SettingsDep, Submitter
from service.app.openapi import json_body
from service.app.schemas import SearchOut
from service.app.submission import Services, submit
from service.app.views import search_out
from service.intake import read_search
from service.store import jobs as job_store
from service.store import searches as search_store
from service.store.models import SEARCH, SUCCEEDED, Job
from service.submissions import SearchSubmission

router = APIRouter(prefix="/v1/searches", tags=["searches"])
SearchId = Annotated[str, PathParam(min_length=1, max_length=36, description="the search's job id")]


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=SearchOut,
    openapi_extra=json_body(SearchSubmission),
    responses={
        422: {"description": "the request is invalid (or past a cap); `field` names what"},
        429: {"description": "the queue, your caps or the checkers are full; see Retry-After"},
    },
)
async def submit_search(request: Request, principal: Submitter) -> Response:
    """Start a search (body: SearchSubmission); poll ``Location`` for its progress and results. The same
    search submitted while it runs joins it."""
    return await submit(Services.of(request), principal, read_search, await request.body())


@router.get("/{search_id}", responses={404: {"description": "no such search"}})
def get_search(search_id: SearchId, session: SessionDep, principal: Reader) -> SearchOut:
    """The search's state and progress (done / total, infeasible, failed, the best so far); its results
    (results.json) once it succeeded."""
    job = _search_job(session, search_id, principal)
    return search_out(job, _results(session, job))


@router.get(
    "/{search_id}/report",
    response_class=HTMLResponse,
    responses={404: {"description": "no such search, or not done"}, 501: {"description": "no report module"}},
)
def get_report(
    search_id: SearchId, session: SessionDep, settings: SettingsDep, principal: Reader
) -> HTMLResponse:
    """The search's HTML report (ranking, throughput against memory, time split, the winner's plan)."""
    from service.search.report.page import report_renderer

    job = _search_job(session, search_id, principal)
    results = _results(session, job)
    if results is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"search {search_id} is {job.state}: no report yet")
    render = report_renderer()
    if render is None:
        raise HTTPException(
            status.HTTP_501_NOT_IMPLEMENTED, "this service has no report module (service.search.report)"
        )
    return HTMLResponse(render(results, Path(settings.search_dir) / job.id))


def _search_job(session: Any, search_id: str, principal: Principal) -> Job:
    job = job_store.get_job(session, search_id, principal.owner_filter)
    if job is None or job.kind != SEARCH:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no search {search_id}")
    return job


def _results(session: Any, job: Job) -> dict[str, Any] | None:
    if job.state != SUCCEEDED:
        return None
    return search_store.get_results(session, job.id)
