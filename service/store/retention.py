"""Retention: finished jobs (with their stored requests), stored results and search files older than the
configured age are deleted, then the database gives the space back (``VACUUM``)."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from service.store import jobs as job_store
from service.store import plans as plan_store
from service.store import searches as search_store
from service.store.models import SEARCH
from service.store.session import Store, is_postgresql

log = logging.getLogger("autoshard.store")
DAY_S = 86400.0


@dataclass
class Purged:
    jobs: int
    results: list[str]
    """Hashes of the results deleted (a replica's memory cache forgets them)."""
    search_folders: int
    search_results: int = 0
    """Searches' results documents deleted."""


def apply_retention(store: Store, days: float, search_dir: Path, now: float | None = None) -> Purged:
    """Delete what finished (jobs) or was stored (results, searches' results) more than ``days`` ago, and
    the deleted searches' folders under ``search_dir``; vacuum when anything went."""
    before = (time.time() if now is None else now) - days * DAY_S
    with store.session() as session:
        jobs = job_store.delete_finished(session, before)
        results = plan_store.delete_plans(session, before)
        searches = search_store.delete_results(session, before)
    folders = 0
    for job_id, kind in jobs:
        folder = search_dir / job_id
        if kind == SEARCH and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            folders += 1
    if jobs or results or searches:
        vacuum(store.engine)
        log.info(
            "retention: deleted %d job(s), %d result(s), %d search folder(s)",
            len(jobs),
            len(results) + searches,
            folders,
        )
    return Purged(len(jobs), results, folders, searches)


def vacuum(engine: Engine) -> None:
    """Give deleted rows' space back: SQLite rewrites its file and truncates its write-ahead log;
    PostgreSQL marks the space reusable (autovacuum would too, later) and refreshes its statistics."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if is_postgresql(engine):
            for table in ("jobs", "plans", "plan_readers", "searches"):
                connection.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
        else:
            connection.exec_driver_sql("VACUUM")
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
