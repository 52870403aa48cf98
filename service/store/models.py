"""The service's tables: jobs (the queue, with leases) and plans (results by problem hash)."""

from __future__ import annotations

from sqlalchemy import Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELED = "queued", "running", "succeeded", "failed", "canceled"
JOB_STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELED)
FINISHED_STATES = (SUCCEEDED, FAILED, CANCELED)
PLAN, SOLVE, SEARCH = "plan", "solve", "search"
"""Job kinds; a search's results document is stored in ``plans`` under its job's ``problem_hash``."""


class Job(Base):
    """One plan or solve to run; timestamps are seconds since the epoch."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    """``plan``, ``solve`` or ``search``."""
    state: Mapped[str] = mapped_column(String(16))
    problem_hash: Mapped[str] = mapped_column(String(64), index=True)
    request: Mapped[str] = mapped_column(Text)
    """The validated request, JSON."""
    time_limit_s: Mapped[float] = mapped_column(Float)
    """The solver's time limit; the job is stopped after it plus the grace of the settings."""
    progress: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The latest progress, JSON: phase, incumbent, bound, gap, elapsed_s."""
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why it failed, JSON: type and message."""
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """The worker that claimed it last (kept after it finished)."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """How many times a worker claimed it (more than one only after a replica died mid-job)."""

    __table_args__ = (Index("ix_jobs_state_created", "state", "created_at"),)


class Plan(Base):
    """A finished result: a plan JSON (``kind`` plan), a solver result (``kind`` solve) or a search's results
    (``kind`` search)."""

    __tablename__ = "plans"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    document: Mapped[str] = mapped_column(Text)
    job_id: Mapped[str] = mapped_column(String(36))
    solve_seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
