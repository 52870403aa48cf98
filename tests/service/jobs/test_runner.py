"""Jobs run by worker processes, on SQLite and on PostgreSQL: a plan and a bare solve go queued -> running
-> succeeded with progress and their result stored; cancel terminates the worker process that ran the job;
a job whose worker is killed runs again, and fails with the reason once its attempts are used; a poisoned
request fails at once while the worker lives on."""

from __future__ import annotations

import gzip
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app.main import create_app
from service.processes import process_running
from service.settings import Settings
from service.store import jobs as job_store
from tests.bundled_data import EXAMPLE, INSTANCE_G

MLP = {"model": "mlp", "mesh": {"shape": [4]}, "solver": {"time_limit_s": 5}}
EXAMPLE_OPTIMUM = 445


@pytest.fixture(scope="module")
def client(module_database_url: str) -> Iterator[TestClient]:
    settings = Settings(
        database_url=module_database_url, workers=1, poll_s=0.1, heartbeat_s=0.5, lease_s=5, max_attempts=2
    )
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 120
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").json()
            time.sleep(0.2)
        yield client


def wait_for(client: TestClient, job_id: str, states: tuple[str, ...], timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def test_a_plan_job_runs_to_a_stored_plan_then_hits_the_cache(client: TestClient) -> None:
    submitted = client.post("/v1/plans", json=MLP)
    assert submitted.status_code == 202
    job = wait_for(client, submitted.json()["id"], ("succeeded", "failed"))
    assert job["state"] == "succeeded", job["error"]
    assert job["attempts"] == 1 and job["progress"]["gap"] is not None and job["progress"]["elapsed_s"] > 0
    plan = client.get(job["plan_url"]).json()
    assert plan["version"] == 1 and plan["mesh"]["shape"] == [4] and set(plan["parameters"]) >= {"w1.weight"}
    assert plan["solver"]["status"] in ("optimal", "feasible")
    again = client.post("/v1/plans", json=MLP)
    assert again.status_code == 200 and again.json() == plan


def test_a_bare_solve_finds_the_example_optimum(client: TestClient) -> None:
    document = json.loads(EXAMPLE.read_text())
    submitted = client.post("/v1/solve", json=document, params={"time_limit_s": 10, "backend": "highs"})
    job = wait_for(client, submitted.json()["id"], ("succeeded", "failed"))
    assert job["state"] == "succeeded", job["error"]
    result = client.get(job["plan_url"]).json()
    assert result["cost"] == EXAMPLE_OPTIMUM and result["status"] == "optimal" and len(result["solution"]) > 0


def test_a_job_whose_worker_is_killed_runs_again(client: TestClient) -> None:
    document = json.loads(gzip.decompress(Path(INSTANCE_G).read_bytes()))
    params = {"time_limit_s": 3, "backend": "heuristic"}
    job_id = client.post("/v1/solve", json=document, params=params).json()["id"]
    wait_for(client, job_id, ("running",))
    os.kill(client.app.state.runner.slots[0].worker.process.pid, signal.SIGKILL)
    job = wait_for(client, job_id, ("succeeded", "failed"), timeout_s=120)
    assert job["state"] == "succeeded" and job["attempts"] == 2, job


def test_a_job_whose_worker_keeps_dying_fails_after_its_attempts(client: TestClient) -> None:
    document = json.loads(gzip.decompress(Path(INSTANCE_G).read_bytes()))
    params = {"time_limit_s": 30, "backend": "heuristic"}
    job_id = client.post("/v1/solve", json=document, params=params).json()["id"]
    for attempt in (1, 2):
        wait_for(client, job_id, ("running",))
        assert client.get(f"/v1/jobs/{job_id}").json()["attempts"] == attempt
        slot = client.app.state.runner.slots[0]
        os.kill(slot.worker.process.pid, signal.SIGKILL)
        if attempt == 1:  # back in the queue, then claimed again by a new worker
            deadline = time.monotonic() + 60
            while client.get(f"/v1/jobs/{job_id}").json()["attempts"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    job = wait_for(client, job_id, ("failed",), timeout_s=60)
    assert job["error"]["type"] == "gave_up" and "worker process died" in job["error"]["message"], job


def test_a_poisoned_stored_request_fails_at_once_and_the_worker_lives_on(client: TestClient) -> None:
    poisoned = "[" * 100_000 + "]" * 100_000  # stored before requests were bounded: it cannot be read back
    with client.app.state.store.session() as session:
        job, _ = job_store.create_job(session, "plan", "9" * 64, poisoned, 5.0, "anonymous")
    done = wait_for(client, job.id, ("succeeded", "failed"), timeout_s=60)
    assert done["state"] == "failed" and done["attempts"] == 1, done
    assert done["error"]["message"].startswith("RecursionError"), done
    after = client.post("/v1/plans", json={**MLP, "batch": 24}).json()
    assert wait_for(client, after["id"], ("succeeded", "failed"))["state"] == "succeeded"


def test_cancel_terminates_the_worker_process_running_the_job(client: TestClient) -> None:
    document = json.loads(gzip.decompress(Path(INSTANCE_G).read_bytes()))
    params = {"time_limit_s": 60, "backend": "heuristic"}
    job_id = client.post("/v1/solve", json=document, params=params).json()["id"]
    wait_for(client, job_id, ("running",))
    slot = client.app.state.runner.slots[0]
    worker = slot.worker.process
    assert worker.is_alive()
    canceled = client.delete(f"/v1/jobs/{job_id}").json()
    assert canceled["state"] == "canceled"
    deadline = time.monotonic() + 20  # stopped, well before its 60 s
    while process_running(worker.pid):  # not worker.join(): the runner joins it too, and two waitpids race
        assert time.monotonic() < deadline, client.get(f"/v1/jobs/{job_id}").json()
        time.sleep(0.05)
    assert wait_for(client, job_id, ("canceled",))["finished_at"] is not None
    time.sleep(1.0)
    assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "canceled"
    assert client.get(f"/v1/plans/{canceled['problem_hash']}").status_code == 404


def test_a_job_past_its_time_limit_and_grace_is_stopped_and_failed(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", workers=1, poll_s=0.1, job_grace_s=0.2
    )
    with TestClient(create_app(settings)) as client:
        while client.get("/readyz").status_code != 200:
            time.sleep(0.2)
        worker = client.app.state.runner.slots[0].worker.process
        request = {
            "model": "gpt2-small",
            "mesh": {"shape": [4]},
            "captured_layers": 0,
            "solver": {"time_limit_s": 0.1},
        }
        job = wait_for(client, client.post("/v1/plans", json=request).json()["id"], ("succeeded", "failed"))
        assert job["state"] == "failed" and job["error"]["type"] == "timeout", job
        assert job["finished_at"] - job["started_at"] < 5
        deadline = time.monotonic() + 10
        while process_running(worker.pid):  # the runner reaps it (a join here would race the runner's)
            assert time.monotonic() < deadline, "the timed-out job's worker is still running"
            time.sleep(0.05)
