"""The service's settings: one class, read from the environment (prefix ``AUTOSHARD_``)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

READ, SUBMIT = "read", "submit"
"""Rights a bearer token may carry: ``read`` (GET) and ``submit`` (POST and DELETE)."""


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
    max_queued_jobs: int = Field(64, ge=1)
    """Queued jobs beyond which a submission is answered 429 with Retry-After."""
    retry_after_s: int = Field(5, ge=1)
    max_time_limit_s: float = Field(600.0, gt=0)
    """The largest solver time limit a request may ask for, seconds."""
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
    plan_cache_bytes: int = Field(256 * 2**20, ge=0)
    """Stored plans kept in memory for cache hits (a plan never changes once stored), bytes."""
    tokens: dict[str, list[str]] = Field(default_factory=dict)
    """Bearer token -> rights (``read``, ``submit``); empty: no authentication. JSON in the environment."""
    cors_origins: list[str] = Field(default_factory=list)
    """Origins allowed by CORS; empty (the default): CORS off."""
    search_dir: str = "searches"
    """Where searches write their files (``<search_dir>/<job id>/results.json``, plans, report.html); share
    it between replicas to serve any search's report from any of them."""
    replica: str = ""
    """This replica's name in the job table's lease column (default: host and process id)."""


@lru_cache
def get_settings() -> Settings:
    return Settings()
