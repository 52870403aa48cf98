"""``/v1/searches``: run ``autoshard search`` as a job (202 and its Location); read its progress and
results; its HTML report once done."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, status
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, JSONResponse, Response

from service.app.deps import CanRead, CanSubmit, SessionDep, SettingsDep
from service.app.schemas import SearchOut, SearchSubmission
from service.planning import BadRequest
from service.search.candidates import mesh_shapes
from service.store import jobs as job_store
from service.store import plans as plan_store
from service.store.models import SEARCH, SUCCEEDED, Job

router = APIRouter(prefix="/v1/searches", tags=["searches"])
SearchId = Annotated[str, PathParam(min_length=1, max_length=36, description="the search's job id")]


@router.post(
    "",
    dependencies=[CanSubmit],
    status_code=status.HTTP_202_ACCEPTED,
    response_model=SearchOut,
    responses={
        422: {"description": "the request is invalid; `field` names what"},
        429: {"description": "busy"},
    },
)
def submit_search(body: SearchSubmission, session: SessionDep, settings: SettingsDep) -> Response:
    """Start a search; poll ``Location`` for its progress and results."""
    from strategies.models import MODELS

    if body.model not in MODELS:
        raise BadRequest("model", f"unknown model {body.model!r}; built-in models are {sorted(MODELS)}")
    if body.solver.time_limit_s > settings.max_time_limit_s:
        raise BadRequest("solver.time_limit_s", f"at most {settings.max_time_limit_s:g} s")
    request = body.model_dump(mode="json")
    candidates = len(mesh_shapes(body.devices, body.max_mesh_dims)) * len(body.batch_sizes)
    if job_store.count_queued(session) >= settings.max_queued_jobs:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"the queue is full ({settings.max_queued_jobs} jobs); retry later",
            headers={"Retry-After": str(settings.retry_after_s)},
        )
    key = hashlib.sha256(f"search:{uuid.uuid4()}:{time.time()}".encode()).hexdigest()
    job = job_store.create_job(session, SEARCH, key, request, body.solver.time_limit_s * candidates)
    session.commit()
    answer = search_out(job, None).model_dump(mode="json")
    return JSONResponse(
        answer, status_code=status.HTTP_202_ACCEPTED, headers={"Location": f"/v1/searches/{job.id}"}
    )


@router.get("/{search_id}", dependencies=[CanRead], responses={404: {"description": "no such search"}})
def get_search(search_id: SearchId, session: SessionDep) -> SearchOut:
    """The search's state and progress (done / total, infeasible, failed, the best so far); its results
    (results.json) once it succeeded."""
    job = _search_job(session, search_id)
    return search_out(job, _results(session, job))


@router.get(
    "/{search_id}/report",
    dependencies=[CanRead],
    response_class=HTMLResponse,
    responses={404: {"description": "no such search, or not done"}, 501: {"description": "no report module"}},
)
def get_report(search_id: SearchId, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    """The search's HTML report (ranking, throughput against memory, time split, the winner's plan)."""
    from service.search.report_page import report_renderer

    job = _search_job(session, search_id)
    results = _results(session, job)
    if results is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"search {search_id} is {job.state}: no report yet")
    render = report_renderer()
    if render is None:
        raise HTTPException(
            status.HTTP_501_NOT_IMPLEMENTED, "this service has no report module (service.search.report)"
        )
    return HTMLResponse(render(results, Path(settings.search_dir) / job.id))


def search_out(job: Job, results: dict[str, Any] | None) -> SearchOut:
    progress = None if job.progress is None else json.loads(job.progress)
    return SearchOut(
        id=job.id,
        state=job.state,  # type: ignore[arg-type]
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        progress=progress if progress is None or progress.get("phase") == "search" else None,  # type: ignore[arg-type]
        error=None if job.error is None else json.loads(job.error),
        results=results,
        report_url=f"/v1/searches/{job.id}/report",
    )


def _search_job(session: Any, search_id: str) -> Job:
    job = job_store.get_job(session, search_id)
    if job is None or job.kind != SEARCH:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no search {search_id}")
    return job


def _results(session: Any, job: Job) -> dict[str, Any] | None:
    if job.state != SUCCEEDED:
        return None
    stored = plan_store.get_plan(session, job.problem_hash)
    return None if stored is None else json.loads(stored.document)
