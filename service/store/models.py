"""The service's tables: jobs (the queue, with leases), plans (results by problem hash) and searches (a search
job's results)."""

from __future__ import annotations

from sqlalchemy import Float, Index, Integer, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELED = "queued", "running", "succeeded", "failed", "canceled"
JOB_STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELED)
FINISHED_STATES = (SUCCEEDED, FAILED, CANCELED)
PLAN, SOLVE, SEARCH = "plan", "solve", "search"
"""Job kinds; a plan's or solve's result is stored in ``plans``, a search's in ``searches``."""
LIVE_JOB = text("state IN ('queued', 'running')")
"""The jobs a resubmission joins: one per owner and problem hash (a unique partial index)."""


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
    """How many times a worker claimed it (more than one only after a replica or worker died mid-job)."""
    owner: Mapped[str] = mapped_column(String(128), default="anonymous")
    """The principal that submitted it: only it (and an admin) sees and cancels it."""
    candidates: Mapped[int] = mapped_column(Integer, default=1)
    """Plans it makes: one for a plan or solve, a search's candidate count (the per-principal caps)."""

    __table_args__ = (
        Index("ix_jobs_state_created", "state", "created_at"),
        Index("ix_jobs_owner_created", "owner", "created_at"),
        Index(
            "ux_jobs_live_hash",
            "owner",
            "problem_hash",
            unique=True,
            sqlite_where=LIVE_JOB,
            postgresql_where=LIVE_JOB,
        ),
    )


class Plan(Base):
    """A finished result: a plan JSON (``kind`` plan) or a solver result (``kind`` solve)."""

    __tablename__ = "plans"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    document: Mapped[str] = mapped_column(Text)
    job_id: Mapped[str] = mapped_column(String(36))
    solve_seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)


class PlanReader(Base):
    """A principal allowed to read a stored result: the owner of a job that made it (or joined it). Results
    are shared by content hash only among their readers, so one tenant never learns what another planned."""

    __tablename__ = "plan_readers"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    principal: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)


class Search(Base):
    """A search job's results document (results.json): read through its job (its owner, or an admin), never
    by content hash (a search is never answered from an earlier one's results; its files live under its job
    id)."""

    __tablename__ = "searches"

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    problem_hash: Mapped[str] = mapped_column(String(64))
    """The job's: the content hash of the canonical search request."""
    document: Mapped[str] = mapped_column(Text)
    solve_seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
