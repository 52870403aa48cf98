"""Plan repository: finished results by problem hash (write once: the same hash has the same answer) and the
principals allowed to read each one."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.models import Plan, PlanReader


def get_plan(session: Session, problem_hash: str, reader: str | None = None) -> Plan | None:
    """The result stored under ``problem_hash`` if ``reader`` may read it (None: anyone may)."""
    plan = session.get(Plan, problem_hash)
    if plan is None or reader is None or may_read(session, problem_hash, reader):
        return plan
    return None


def may_read(session: Session, problem_hash: str, reader: str) -> bool:
    return session.get(PlanReader, (problem_hash, reader)) is not None


def grant(session: Session, problem_hash: str, reader: str) -> None:
    """Let ``reader`` read the result of ``problem_hash`` (idempotent, and safe when replicas race)."""
    if may_read(session, problem_hash, reader):
        return
    try:
        with session.begin_nested():
            session.add(PlanReader(hash=problem_hash, principal=reader, created_at=time.time()))
    except IntegrityError:  # another replica granted it first
        pass


def save_plan(
    session: Session,
    problem_hash: str,
    kind: str,
    document: dict[str, Any] | str,
    job_id: str,
    solve_seconds: float,
    reader: str,
) -> bool:
    """Store a result (a document, or its JSON text) unless one for ``problem_hash`` is there already, and
    let ``reader`` (the owner of the job that made it) read it; True when this one was stored."""
    stored = False
    if session.get(Plan, problem_hash) is None:
        plan = Plan(
            hash=problem_hash,
            kind=kind,
            document=document if isinstance(document, str) else json.dumps(document),
            job_id=job_id,
            solve_seconds=solve_seconds,
            created_at=time.time(),
        )
        try:
            with session.begin_nested():
                session.add(plan)
            stored = True
        except IntegrityError:  # another replica stored the same answer first
            pass
    grant(session, problem_hash, reader)
    return stored


def delete_plans(session: Session, before: float) -> list[str]:
    """Delete the results (and their readers) stored before ``before``; their hashes."""
    old = Plan.created_at < before
    hashes = list(session.scalars(select(Plan.hash).where(old)))
    if hashes:
        session.execute(delete(Plan).where(old).execution_options(synchronize_session=False))
        for start in range(0, len(hashes), 500):
            chunk = hashes[start : start + 500]
            session.execute(
                delete(PlanReader)
                .where(PlanReader.hash.in_(chunk))
                .execution_options(synchronize_session=False)
            )
    return hashes
