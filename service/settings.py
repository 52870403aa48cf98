"""The service's settings: one class, read from the environment (prefix ``AUTOSHARD_``)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.access import check_tokens


class Settings(BaseSettings):
    """Every knob of ``autoshard serve``; e.g. ``AUTOSHARD_DATABASE_URL=postgresql+psycopg://...``."""

    model_config = SettingsConfigDict(env_prefix="AUTOSHARD_", extra="ignore")

    host: str = "127.0.0.1"
    """Address uvicorn listens on."""
    port: int = Field(8000, ge=0, le=65535)
    database_url: str = "sqlite:///autoshard.db"
    """SQLAlchemy URL: a SQLite file by default, ``postgresql+psycopg://user@host/db`` to share replicas."""
    workers: int = Field(1, ge=0, le=64)
    """Solver worker processes of this replica (0: accept jobs, run none)."""
    max_live_jobs: int = Field(64, ge=1)
    """Queued plus running jobs (of every principal) beyond which a submission is answered 429 with
    Retry-After."""
    retry_after_s: int = Field(5, ge=1)
    max_time_limit_s: float = Field(600.0, gt=0)
    """The largest solver time limit a request may ask for (a search: per candidate), seconds."""
    max_search_candidates: int = Field(256, ge=1)
    """The most candidates (meshes x batch sizes) one search may plan; more: 422."""
    max_job_solver_s: float = Field(4 * 3600.0, gt=0)
    """The most solver seconds one job may ask for (a search: its time limit x its candidates); more: 422."""
    max_principal_solver_s: float = Field(12 * 3600.0, gt=0)
    """Solver seconds one principal's queued and running jobs may ask for together; past it: 429."""
    max_principal_candidates: int = Field(1024, ge=1)
    """Candidates (a plan or solve: one; a search: its count) of one principal's live jobs; past it: 429."""
    max_attempts: int = Field(3, ge=1, le=100)
    """Times a job is handed to a worker (its replica died, its worker was killed, it could not be handed
    over) before it fails with the reason; never re-queued forever."""
    job_grace_s: float = Field(120.0, gt=0)
    """A job is stopped when it runs this long past its solver time limit (capture, build, write), seconds."""
    lease_s: float = Field(30.0, gt=0)
    """A running job whose lease is not renewed for this long is re-queued (its replica died), seconds."""
    heartbeat_s: float = Field(5.0, gt=0)
    """How often a replica renews the leases of the jobs it runs, seconds."""
    poll_s: float = Field(0.5, gt=0)
    """How often an idle worker looks for queued jobs, seconds."""
    max_body_bytes: int = Field(16 * 2**20, ge=1024)
    """Largest request body; larger ones get 413."""
    max_graph_bytes: int = Field(4 * 2**20, ge=1024)
    """Largest launcher graph (its JSON), bytes."""
    check_workers: int = Field(1, ge=0, le=16)
    """Processes that read and check submissions off the event loop (graph documents, models built on the
    meta device); 0: a thread of the API process, without the CPU-time limit (tests, development)."""
    check_cpu_s: float = Field(60.0, gt=0)
    """CPU seconds one submission's check may take; past it: 422 naming the body (or its graph)."""
    max_pending_checks: int = Field(16, ge=1)
    """Submissions being checked at once (running or waiting for a checker); more: 429."""
    inline_check_bytes: int = Field(64 * 2**10, ge=0)
    """Bodies up to this size are read (parsed, bounded, hashed) in the API process; larger ones by a
    checker process, so a large document never holds the event loop."""
    explain_workers: int = Field(2, ge=1, le=16)
    """Processes answering ``/explain`` (each rebuilds a plan's problem, seconds of CPU)."""
    max_pending_explains: int = Field(32, ge=1)
    """Explain requests computed or waiting at once; more: 429."""
    plan_cache_bytes: int = Field(256 * 2**20, ge=0)
    """Stored plans kept in memory for cache hits (a plan never changes once stored), bytes."""
    retention_days: float = Field(30.0, ge=0)
    """Finished jobs (their stored requests), results and search files older than this are deleted and the
    database vacuumed; 0 keeps everything."""
    retention_every_s: float = Field(3600.0, gt=0)
    """How often a replica applies the retention, seconds."""
    tokens: dict[str, list[str]] = Field(default_factory=dict)
    """Bearer token -> scopes: ``read``, ``submit``, ``admin`` (every principal's jobs and plans),
    ``metrics`` (``/metrics``, the detailed ``/readyz``) and ``principal:NAME`` (the principal the token acts
    as; default: its own). Empty: no authentication, one principal. JSON in the environment."""
    cors_origins: list[str] = Field(default_factory=list)
    """Origins allowed by CORS; empty (the default): CORS off."""
    search_dir: str = "searches"
    """Where searches write their files (``<search_dir>/<job id>/results.json``, plans, report.html); share
    it between replicas to serve any search's report from any of them."""
    replica: str = ""
    """This replica's name in the job table's lease column (default: host and process id)."""

    @field_validator("tokens")
    @classmethod
    def _known_scopes(cls, tokens: dict[str, list[str]]) -> dict[str, list[str]]:
        check_tokens(tokens)
        return tokens


@lru_cache
def get_settings() -> Settings:
    return Settings()
