"""Search repository: a search job's results document, stored once by job id, read through the job."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.models import Search


def get_results(session: Session, job_id: str) -> dict[str, Any] | None:
    """The results document of the search job ``job_id``; None before it succeeded."""
    search = session.get(Search, job_id)
    return None if search is None else json.loads(search.document)


def save_results(
    session: Session, job_id: str, problem_hash: str, document: dict[str, Any] | str, solve_seconds: float
) -> bool:
    """Store the results (a document, or its JSON text) of the search job ``job_id`` unless they are there
    already; True when these were stored."""
    if session.get(Search, job_id) is not None:
        return False
    search = Search(
        job_id=job_id,
        problem_hash=problem_hash,
        document=document if isinstance(document, str) else json.dumps(document),
        solve_seconds=solve_seconds,
        created_at=time.time(),
    )
    try:
        with session.begin_nested():
            session.add(search)
    except IntegrityError:  # another replica stored them first
        return False
    return True


def delete_results(session: Session, before: float) -> int:
    """Delete the results stored before ``before``; how many."""
    result = session.execute(
        delete(Search).where(Search.created_at < before).execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)
