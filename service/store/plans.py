"""Plan repository: finished results by problem hash (write once: the same hash has the same answer)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.models import Plan


def get_plan(session: Session, problem_hash: str) -> Plan | None:
    return session.get(Plan, problem_hash)


def save_plan(
    session: Session,
    problem_hash: str,
    kind: str,
    document: dict[str, Any],
    job_id: str,
    solve_seconds: float,
) -> bool:
    """Store a result unless one for ``problem_hash`` is there already; True when this one was stored."""
    if session.get(Plan, problem_hash) is not None:
        return False
    plan = Plan(
        hash=problem_hash,
        kind=kind,
        document=json.dumps(document),
        job_id=job_id,
        solve_seconds=solve_seconds,
        created_at=time.time(),
    )
    try:
        with session.begin_nested():
            session.add(plan)
    except IntegrityError:  # another replica stored the same answer first
        return False
    return True
