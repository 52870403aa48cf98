"""Response bodies of the REST API (pydantic); the request bodies are the service's submissions
(:mod:`service.submissions`), below the web layer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

JobState = Literal["queued", "running", "succeeded", "failed", "canceled"]


class Progress(BaseModel):
    phase: str | None = None
    incumbent: float | None = None
    bound: float | None = None
    gap: float | None = None
    elapsed_s: float | None = None


class JobError(BaseModel):
    type: str
    message: str


class JobOut(BaseModel):
    id: str
    kind: Literal["plan", "solve", "search"]
    state: JobState
    problem_hash: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    progress: Progress | None
    error: JobError | None
    plan_url: str | None = Field(description="where the result is, once the job succeeded")


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class SearchProgress(BaseModel):
    done: int = 0
    total: int = 0
    planned: int = 0
    infeasible: int = 0
    pruned: int = 0
    failed: int = 0
    skipped: int = 0
    best: dict[str, Any] | None = Field(None, description="the fastest candidate so far")
    elapsed_s: float | None = None


class SearchOut(BaseModel):
    id: str
    state: JobState
    created_at: float
    started_at: float | None
    finished_at: float | None
    progress: SearchProgress | None
    error: JobError | None
    results: dict[str, Any] | None = Field(description="results.json, once the search succeeded")
    report_url: str


class ModelInfo(BaseModel):
    name: str
    options: dict[str, Any]
    layers: int | None


class ErrorBody(BaseModel):
    detail: str
    field: str | None = None
