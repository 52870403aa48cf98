"""The job and plan repositories on SQLite and on a real PostgreSQL server: migrations, the claim (one
claimant per job, also under concurrency), leases, bounded re-queue, cancel, paging, owners, one live job
per owner and problem (also under concurrency), write-once plans and their readers, retention."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text

from service.store import jobs as job_store
from service.store import plans as plan_store
from service.store import searches as search_store
from service.store.migrate import alembic_config, is_at_head, upgrade_to_head
from service.store.models import CANCELED, FAILED, QUEUED, RUNNING, SEARCH, SUCCEEDED
from service.store.retention import DAY_S, apply_retention
from service.store.session import Store


@pytest.fixture
def store(database_url: str) -> Store:
    upgrade_to_head(database_url)
    store = Store(database_url)
    yield store
    store.dispose()


def _create(session, key: str, owner: str = "alice", kind: str = "plan", time_limit_s: float = 5.0):
    return job_store.create_job(session, kind, key, json.dumps({"key": key}), time_limit_s, owner)


def _queue(store: Store, count: int, owner: str = "alice") -> list[str]:
    with store.session() as session:
        return [_create(session, f"{i:064x}", owner)[0].id for i in range(count)]


def test_migrations_create_the_tables_and_reach_head(store: Store) -> None:
    tables = set(inspect(store.engine).get_table_names())
    assert {"jobs", "plans", "plan_readers", "alembic_version"} <= tables
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
        assert job_store.expire_leases(session, max_attempts=3) == (0, 0)
    time.sleep(0.3)
    with store.session() as session:
        assert job_store.expire_leases(session, max_attempts=3) == (1, 0)
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
        assert plan_store.save_plan(session, key, "plan", {"version": 1}, "job-1", 1.5, "alice")
    with store.session() as session:
        assert not plan_store.save_plan(session, key, "plan", {"version": 2}, "job-2", 1.0, "alice")
    with store.session() as session:
        stored = plan_store.get_plan(session, key)
    assert stored.document == '{"version": 1}' and stored.job_id == "job-1"


def test_a_plan_is_read_only_by_its_readers(store: Store) -> None:
    key = "cd" * 32
    with store.session() as session:
        assert plan_store.save_plan(session, key, "plan", {"version": 1}, "job-1", 1.5, "alice")
    with store.session() as session:
        assert plan_store.get_plan(session, key, "alice") is not None
        assert plan_store.get_plan(session, key, "bob") is None
        assert plan_store.get_plan(session, key, None) is not None  # an admin's read
        assert not plan_store.save_plan(session, key, "plan", {"version": 2}, "job-2", 1.0, "bob")
    with store.session() as session:
        assert plan_store.get_plan(session, key, "bob").document == '{"version": 1}'  # bob's job made it too


def test_a_searchs_results_are_stored_once_under_its_job_and_not_among_plans(store: Store) -> None:
    with store.session() as session:
        job, _ = _create(session, "0e" * 32, kind=SEARCH)
        assert search_store.save_results(session, job.id, job.problem_hash, {"candidates": [1]}, 2.0)
        assert not search_store.save_results(session, job.id, job.problem_hash, {"candidates": [2]}, 2.0)
    with store.session() as session:
        assert search_store.get_results(session, job.id) == {"candidates": [1]}
        assert search_store.get_results(session, "no-such-job") is None
        row = session.execute(text("SELECT job_id, problem_hash FROM searches")).one()
        assert tuple(row) == (job.id, "0e" * 32)
        assert session.execute(text("SELECT count(*) FROM plans")).scalar() == 0


def test_a_resubmission_joins_the_owners_live_job_and_no_one_elses(store: Store) -> None:
    key = "ef" * 32
    with store.session() as session:
        first, created = _create(session, key, "alice")
        again, created_again = _create(session, key, "alice")
        other, created_other = _create(session, key, "bob")
    assert created and not created_again and again.id == first.id
    assert created_other and other.id != first.id
    with store.session() as session:
        job_store.cancel_job(session, first.id)
    with store.session() as session:
        after, created_after = _create(session, key, "alice")  # a finished job is not joined
    assert created_after and after.id != first.id


def test_identical_submissions_at_once_become_one_job(store: Store) -> None:
    key = "12" * 32
    ids: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def submit() -> None:
        start.wait()
        with store.session() as session:
            job, _ = _create(session, key)
            with lock:
                ids.append(job.id)

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 6 and len(set(ids)) == 1
    with store.session() as session:
        assert job_store.list_jobs(session, None, 10, 0)[1] == 1


def test_owners_see_and_cancel_only_their_jobs(store: Store) -> None:
    (mine,) = _queue(store, 1, "alice")
    (theirs,) = _queue(store, 1, "bob")
    with store.session() as session:
        assert job_store.get_job(session, theirs, "alice") is None
        assert job_store.cancel_job(session, theirs, "alice") is None
        assert [job.id for job in job_store.list_jobs(session, None, 10, 0, "alice")[0]] == [mine]
        assert job_store.list_jobs(session, None, 10, 0, None)[1] == 2  # an admin's list
        assert job_store.get_job(session, theirs).state == QUEUED
        assert job_store.live_work(session, "alice") == (5.0, 1)
        assert job_store.count_live(session) == 2


def test_a_job_whose_lease_keeps_expiring_fails_after_its_attempts(store: Store) -> None:
    (job_id,) = _queue(store, 1)
    for attempt in range(1, 4):
        with store.session() as session:
            assert job_store.claim_next_job(session, f"dead/{attempt}", lease_s=0.05).attempts == attempt
        time.sleep(0.1)
        with store.session() as session:
            expected = (1, 0) if attempt < 3 else (0, 1)
            assert job_store.expire_leases(session, max_attempts=3) == expected
    with store.session() as session:
        job = job_store.get_job(session, job_id)
        error = json.loads(job.error)
    assert job.state == FAILED and error["type"] == "gave_up"
    assert "3 attempt(s)" in error["message"] and "lease" in error["message"]


def test_a_job_that_cannot_run_is_retried_then_failed_with_the_reason(store: Store) -> None:
    (job_id,) = _queue(store, 1)
    states = []
    for _ in range(3):
        with store.session() as session:
            job_store.claim_next_job(session, "a/0", lease_s=30)
        with store.session() as session:
            states.append(job_store.retry_or_fail(session, job_id, "a/0", "its worker process died", 3))
    assert states == [QUEUED, QUEUED, FAILED]
    with store.session() as session:
        job = job_store.get_job(session, job_id)
        assert job.state == FAILED and "its worker process died" in json.loads(job.error)["message"]
        assert job_store.retry_or_fail(session, job_id, "a/0", "again", 3) is None  # no longer running


def test_a_replica_stopping_hands_its_jobs_back_without_using_an_attempt(store: Store) -> None:
    (job_id,) = _queue(store, 1)
    with store.session() as session:
        job_store.claim_next_job(session, "a/0", lease_s=30)
    with store.session() as session:
        assert job_store.release_jobs(session, "a/0") == 1
    with store.session() as session:
        job = job_store.get_job(session, job_id)
        assert job.state == QUEUED and job.attempts == 0


def test_retention_deletes_old_finished_jobs_results_and_search_folders(store: Store, tmp_path: Path) -> None:
    old_key, new_key = "0a" * 32, "0b" * 32
    with store.session() as session:
        old_search, _ = _create(session, "0c" * 32, kind=SEARCH)
        old_plan, _ = _create(session, old_key)
        live, _ = _create(session, "0d" * 32)
        plan_store.save_plan(session, old_key, "plan", {"junk": "x" * 100_000}, old_plan.id, 1.0, "alice")
        plan_store.save_plan(session, new_key, "plan", {"version": 1}, "job-new", 1.0, "alice")
        for job in (old_search, old_plan):
            job.state = SUCCEEDED
        session.flush()
        session.execute(
            text("UPDATE jobs SET finished_at = :t WHERE id IN (:a, :b)"),
            {"t": time.time() - 40 * DAY_S, "a": old_search.id, "b": old_plan.id},
        )
        session.execute(
            text("UPDATE plans SET created_at = :t WHERE hash = :h"),
            {"t": time.time() - 40 * DAY_S, "h": old_key},
        )
        search_store.save_results(session, old_search.id, old_search.problem_hash, {"candidates": []}, 1.0)
        session.execute(
            text("UPDATE searches SET created_at = :t WHERE job_id = :id"),
            {"t": time.time() - 40 * DAY_S, "id": old_search.id},
        )
    (tmp_path / old_search.id).mkdir()
    (tmp_path / old_search.id / "results.json").write_text("{}")
    purged = apply_retention(store, days=30, search_dir=tmp_path)
    assert purged.jobs == 2 and purged.results == [old_key] and purged.search_folders == 1
    assert purged.search_results == 1
    assert not (tmp_path / old_search.id).exists()
    with store.session() as session:
        assert (
            job_store.get_job(session, old_plan.id) is None
            and job_store.get_job(session, live.id) is not None
        )
        assert (
            plan_store.get_plan(session, old_key) is None
            and plan_store.get_plan(session, new_key) is not None
        )
        assert not plan_store.may_read(session, old_key, "alice")
        assert search_store.get_results(session, old_search.id) is None


def test_the_migration_keeps_one_live_job_per_problem_of_an_old_database(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "0001")
    store = Store(database_url)
    try:
        with store.session() as session:
            for i, state in enumerate(("queued", "running", "queued", "succeeded")):
                session.execute(
                    text(
                        "INSERT INTO jobs (id, kind, state, problem_hash, request, time_limit_s, created_at, "
                        "attempts) VALUES (:id, 'plan', :state, :hash, '{}', 5, :t, 0)"
                    ),
                    {"id": f"job-{i}", "state": state, "hash": "ee" * 32, "t": 1000.0 + i},
                )
            session.execute(
                text(
                    "INSERT INTO plans (hash, kind, document, job_id, solve_seconds, created_at) "
                    "VALUES (:h, 'plan', '{}', 'job-3', 1, 1000)"
                ),
                {"h": "ee" * 32},
            )
        upgrade_to_head(database_url)
        with store.session() as session:
            states = dict(session.execute(text("SELECT id, state FROM jobs")).all())
            owners = {row[0] for row in session.execute(text("SELECT owner FROM jobs"))}
            assert plan_store.may_read(session, "ee" * 32, "anonymous")
        assert states == {"job-0": "queued", "job-1": "canceled", "job-2": "canceled", "job-3": "succeeded"}
        assert owners == {"anonymous"}
    finally:
        store.dispose()


def test_the_migration_moves_an_old_databases_search_results_to_their_table(database_url: str) -> None:
    import hashlib

    command.upgrade(alembic_config(database_url), "0002")
    store = Store(database_url)
    old_key = hashlib.sha256(b"autoshard-search-results:job-s").hexdigest()  # where 0002 kept them
    rows = {
        "jobs": [("job-s", "search", "5e" * 32, "bob"), ("job-p", "plan", "9a" * 32, "bob")],
        "plans": [(old_key, "search", '{"candidates": []}', "job-s"), ("9a" * 32, "plan", "{}", "job-p")],
        "plan_readers": [(old_key, "bob"), ("9a" * 32, "bob")],
    }
    try:
        with store.session() as session:
            for job_id, kind, key, owner in rows["jobs"]:
                session.execute(
                    text(
                        "INSERT INTO jobs (id, kind, state, problem_hash, request, time_limit_s, created_at, "
                        "attempts, owner, candidates) "
                        "VALUES (:id, :kind, 'succeeded', :hash, '{}', 5, 1000, 1, :owner, 1)"
                    ),
                    {"id": job_id, "kind": kind, "hash": key, "owner": owner},
                )
            for key, kind, document, job_id in rows["plans"]:
                session.execute(
                    text(
                        "INSERT INTO plans (hash, kind, document, job_id, solve_seconds, created_at) "
                        "VALUES (:h, :kind, :document, :job, 3, 1001)"
                    ),
                    {"h": key, "kind": kind, "document": document, "job": job_id},
                )
            for key, principal in rows["plan_readers"]:
                session.execute(
                    text("INSERT INTO plan_readers (hash, principal, created_at) VALUES (:h, :p, 1001)"),
                    {"h": key, "p": principal},
                )
        upgrade_to_head(database_url)
        with store.session() as session:
            assert search_store.get_results(session, "job-s") == {"candidates": []}
            moved = session.execute(
                text("SELECT problem_hash, solve_seconds, created_at FROM searches")
            ).all()
            assert [tuple(row) for row in moved] == [("5e" * 32, 3.0, 1001.0)]
            assert [row[0] for row in session.execute(text("SELECT hash FROM plans"))] == ["9a" * 32]
            assert [row[0] for row in session.execute(text("SELECT hash FROM plan_readers"))] == ["9a" * 32]
        command.downgrade(alembic_config(database_url), "0002")  # and back, as 0002 kept them
        with store.session() as session:
            kinds = dict(session.execute(text("SELECT hash, kind FROM plans")).all())
            assert kinds == {old_key: "search", "9a" * 32: "plan"}
            assert plan_store.may_read(session, old_key, "bob")
        assert "searches" not in inspect(store.engine).get_table_names()
    finally:
        store.dispose()
