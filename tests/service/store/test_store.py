"""The job and plan repositories on SQLite and on a real PostgreSQL server: migrations, the claim (one
claimant per job, also under concurrency), leases, re-queue, cancel, paging, write-once plans."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import inspect

from service.store import jobs as job_store
from service.store import plans as plan_store
from service.store.migrate import is_at_head, upgrade_to_head
from service.store.models import CANCELED, QUEUED, RUNNING, SUCCEEDED
from service.store.session import Store


@pytest.fixture
def store(database_url: str) -> Store:
    upgrade_to_head(database_url)
    store = Store(database_url)
    yield store
    store.dispose()


def _queue(store: Store, count: int) -> list[str]:
    with store.session() as session:
        return [job_store.create_job(session, "plan", f"{i:064x}", {"i": i}, 5.0).id for i in range(count)]


def test_migrations_create_both_tables_and_reach_head(store: Store) -> None:
    assert {"jobs", "plans", "alembic_version"} <= set(inspect(store.engine).get_table_names())
    assert is_at_head(store.engine, store.url)
    upgrade_to_head(store.url)  # a second start migrates nothing and fails nothing
    assert is_at_head(store.engine, store.url)


def test_claim_takes_the_oldest_queued_job_once(store: Store) -> None:
    first, second = _queue(store, 2)
    with store.session() as session:
        job = job_store.claim_next_job(session, "replica-a/0", lease_s=30)
        assert job is not None and job.id == first and job.state == RUNNING and job.attempts == 1
        assert job.claimed_by == "replica-a/0"
    with store.session() as session:
        assert job_store.claim_next_job(session, "replica-b/0", lease_s=30).id == second
    with store.session() as session:
        assert job_store.claim_next_job(session, "replica-b/0", lease_s=30) is None


def test_concurrent_claimants_never_share_a_job(store: Store) -> None:
    queued = _queue(store, 12)
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_all(owner: str) -> None:
        while True:
            with store.session() as session:
                job = job_store.claim_next_job(session, owner, lease_s=30)
                job_id = None if job is None else job.id
            if job_id is None:
                return
            with lock:
                claimed.append(job_id)

    threads = [threading.Thread(target=claim_all, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == sorted(queued)
    with store.session() as session:
        page, total = job_store.list_jobs(session, RUNNING, limit=100, offset=0)
    assert total == 12 and all(job.attempts == 1 for job in page)


def test_a_lease_not_renewed_expires_and_the_job_is_queued_again(store: Store) -> None:
    (job_id,) = _queue(store, 1)
    with store.session() as session:
        job_store.claim_next_job(session, "dead/0", lease_s=0.2)
    with store.session() as session:
        assert job_store.requeue_expired(session) == 0
    time.sleep(0.3)
    with store.session() as session:
        assert job_store.requeue_expired(session) == 1
        assert job_store.get_job(session, job_id).state == QUEUED
    with store.session() as session:
        assert not job_store.renew_lease(session, job_id, "dead/0", 30, None)  # no longer its own
        job = job_store.claim_next_job(session, "alive/0", lease_s=30)
        assert job.id == job_id and job.attempts == 2


def test_renewing_records_progress_and_finish_needs_the_lease(store: Store) -> None:
    (job_id,) = _queue(store, 1)
    with store.session() as session:
        job_store.claim_next_job(session, "a/0", lease_s=30)
    with store.session() as session:
        assert job_store.renew_lease(session, job_id, "a/0", 30, {"phase": "solve", "gap": 0.5})
        assert not job_store.finish_job(session, job_id, "b/0", SUCCEEDED)
        assert job_store.finish_job(session, job_id, "a/0", SUCCEEDED)
    with store.session() as session:
        job = job_store.get_job(session, job_id)
        assert job.state == SUCCEEDED and '"gap": 0.5' in job.progress and job.lease_owner is None


def test_cancel_stops_queued_and_running_jobs_and_leaves_finished_ones(store: Store) -> None:
    running, queued, finished = _queue(store, 3)
    with store.session() as session:
        assert job_store.claim_next_job(session, "a/0", lease_s=30).id == running
    with store.session() as session:
        assert job_store.cancel_job(session, queued).state == CANCELED
        assert job_store.claim_next_job(session, "a/0", lease_s=30).id == finished
        assert job_store.finish_job(session, finished, "a/0", SUCCEEDED)
    with store.session() as session:
        assert job_store.cancel_job(session, running).state == CANCELED
        assert job_store.cancel_job(session, finished).state == SUCCEEDED
        assert job_store.cancel_job(session, "no-such-job") is None
    with store.session() as session:
        assert not job_store.renew_lease(session, running, "a/0", 30, None)  # its worker must stop


def test_jobs_page_newest_first_with_a_total(store: Store) -> None:
    ids = _queue(store, 5)
    with store.session() as session:
        first, total = job_store.list_jobs(session, None, limit=2, offset=0)
        rest, _ = job_store.list_jobs(session, None, limit=10, offset=2)
        counts = job_store.counts_by_state(session)
    assert total == 5 and [j.id for j in first + rest] == ids[::-1]
    assert counts[QUEUED] == 5 and counts[RUNNING] == 0


def test_a_plan_is_written_once_per_hash(store: Store) -> None:
    key = "ab" * 32
    with store.session() as session:
        assert plan_store.save_plan(session, key, "plan", {"version": 1}, "job-1", 1.5)
    with store.session() as session:
        assert not plan_store.save_plan(session, key, "plan", {"version": 2}, "job-2", 1.0)
    with store.session() as session:
        stored = plan_store.get_plan(session, key)
    assert stored.document == '{"version": 1}' and stored.job_id == "job-1"
