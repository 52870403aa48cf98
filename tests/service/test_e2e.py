"""End to end against real ``autoshard serve`` processes on 127.0.0.1, started as the service image starts
them: submit -> poll -> plan with the Python client, the cache on resubmit, explain, cancel (the worker
process goes), auth, every bad-input class, the image's health check, a restart with a job in flight, and
two replicas on one PostgreSQL running each job exactly once."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from service.client import AutoshardClient, ServiceError
from service.processes import process_running
from tests.bundled_data import INSTANCE_G
from tests.service.postgres import PostgresServer, free_port
from tests.service.server import ServerProcess
from tests.strategies.graph.graph_documents import exported_text

WRITER, READER, MONITOR = "writer-token", "reader-token", "monitor-token"
TOKENS = {WRITER: ["read", "submit"], READER: ["read"], MONITOR: ["metrics"]}
FAST = {"poll_s": 0.2, "heartbeat_s": 0.5, "lease_s": 3}
MLP = {"model": "mlp", "mesh": {"shape": [4]}, "solver": {"time_limit_s": 5}}


def long_solve(seconds: float) -> tuple[dict, dict]:
    """Instance G with the heuristic backend, which works on until near its time limit."""
    document = json.loads(gzip.decompress(Path(INSTANCE_G).read_bytes()))
    return document, {"backend": "heuristic", "time_limit_s": seconds}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("serve")
    process = ServerProcess(
        f"sqlite:///{folder / 'autoshard.db'}", folder / "log", workers=1, tokens=TOKENS, **FAST
    )
    process.start().wait_ready()
    yield process
    process.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[AutoshardClient]:
    with AutoshardClient(server.url, token=WRITER, retries=2, backoff_s=0.1) as client:
        yield client


def test_the_image_health_check_passes_on_a_live_server_and_fails_without_one(server: ServerProcess) -> None:
    check = [sys.executable, "-m", "service.healthcheck"]
    assert subprocess.run(check, env={**server.env}, timeout=30).returncode == 0
    dead = {**server.env, "AUTOSHARD_PORT": str(free_port())}
    assert subprocess.run(check, env=dead, capture_output=True, timeout=30).returncode == 1


def test_submit_wait_and_fetch_then_the_cache_answers(client: AutoshardClient) -> None:
    seen: list[dict] = []
    plan = client.plan(MLP, progress=seen.append, timeout_s=120)
    assert plan["version"] == 1 and plan["mesh"]["shape"] == [4]
    assert seen[-1]["state"] == "succeeded" and {"queued", "running"} & {job["state"] for job in seen}
    again = client.submit_plan(MLP)
    assert again.cached and again.result == plan
    report = client.explain(seen[-1]["problem_hash"], "w1.weight")
    assert report["target"] == "w1.weight" and report["plan"]["consistent"]


def test_a_launchers_graph_is_planned_as_its_module(client: AutoshardClient) -> None:
    """The service plans a graph document (no model code imported) into the plan of the module itself."""
    module = client.plan({**MLP, "batch": 64, "solver": {"time_limit_s": 30, "gap": 0.0}}, timeout_s=120)
    document = json.loads(exported_text("mlp"))  # mlp, batch 64, as the launcher exported it
    graph = client.plan(
        {"graph": document, "mesh": {"shape": [4]}, "solver": {"time_limit_s": 30, "gap": 0.0}}, timeout_s=120
    )
    assert graph["request"]["graph"]["sha256"] and not graph["request"]["model"]
    for key in ("parameters", "inputs", "nodes"):
        assert graph[key] == module[key], key
    assert graph["predicted"] == module["predicted"]


def test_cancel_stops_the_worker_process(server: ServerProcess, client: AutoshardClient) -> None:
    document, options = long_solve(60)
    job = client.submit_solve(document, **options).job
    deadline = time.monotonic() + 60
    while client.job(job["id"])["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (worker,) = server.worker_pids()
    assert client.cancel(job["id"])["state"] == "canceled"
    deadline = time.monotonic() + 10
    while process_running(worker):
        assert time.monotonic() < deadline, "the canceled job's worker is still running"
        time.sleep(0.1)
    assert client.job(job["id"])["state"] == "canceled"


def test_tokens_are_required_and_rights_checked(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/v1/jobs").status_code == 401
    reader = {"Authorization": f"Bearer {READER}"}
    assert httpx.get(f"{server.url}/v1/jobs", headers=reader).status_code == 200
    assert httpx.post(f"{server.url}/v1/plans", json=MLP, headers=reader).status_code == 403
    with (
        AutoshardClient(server.url, token=READER, retries=0) as client,
        pytest.raises(ServiceError) as refused,
    ):
        client.submit_plan(MLP)
    assert refused.value.status == 403


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b'{"model": "mlp", "mesh": ', 422, "body"),
        (b"[" + b"0," * (9 * 2**20) + b"0]", 413, "body"),
        (json.dumps({**MLP, "model": "no-such-model"}).encode(), 422, "model"),
        (
            json.dumps({**MLP, "mesh": {"shape": [4], "axis_names": ["dp", "tp"]}}).encode(),
            422,
            "mesh.axis_names",
        ),
        (json.dumps({**MLP, "mesh": {"shape": [-2]}}).encode(), 422, "mesh.shape[0]"),
        (json.dumps({**MLP, "memory_gib": 0.0001}).encode(), 422, "memory_gib"),
        (json.dumps({**MLP, "model": None, "graph": "not an object"}).encode(), 422, "graph"),
        (
            json.dumps({**MLP, "model": None, "graph": {"version": 1, "nodes": []}}).encode(),
            422,
            "graph.format",
        ),
    ],
)
def test_each_bad_input_gets_its_4xx(server: ServerProcess, body: bytes, status: int, field: str) -> None:
    headers = {"Authorization": f"Bearer {WRITER}", "Content-Type": "application/json"}
    response = httpx.post(f"{server.url}/v1/plans", content=body, headers=headers, timeout=60)
    assert response.status_code == status, response.text
    assert response.json()["field"] == field and "Traceback" not in response.text


def test_unknown_resources_get_404(client: AutoshardClient) -> None:
    for call in (lambda: client.job("no-such-job"), lambda: client.fetch_plan("f" * 64)):
        with pytest.raises(ServiceError) as missing:
            call()
        assert missing.value.status == 404


def test_a_job_in_flight_when_the_server_dies_completes_after_the_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'autoshard.db'}"
    first = ServerProcess(url, tmp_path / "log", workers=1, **FAST).start().wait_ready()
    second = None
    try:
        document, options = long_solve(5)
        with AutoshardClient(first.url) as client:
            job = client.submit_solve(document, **options).job
            while client.job(job["id"])["state"] != "running":
                time.sleep(0.1)
        (worker,) = first.worker_pids()
        first.kill()
        deadline = time.monotonic() + 5
        while process_running(worker):  # a worker whose server died stops on its own
            assert time.monotonic() < deadline, "orphaned worker still running"
            time.sleep(0.1)
        with create_engine(url).connect() as connection:
            assert connection.execute(text("SELECT state FROM jobs")).scalar() == "running"
        second = ServerProcess(url, tmp_path / "log", workers=1, **FAST).start().wait_ready()
        with AutoshardClient(second.url) as client:
            done = client.wait(job["id"], timeout_s=90)
            assert done["state"] == "succeeded" and done["attempts"] == 2
            assert client.fetch_plan(done["problem_hash"])["solution"]
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_two_replicas_on_postgresql_run_each_job_exactly_once(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    url = postgres_server.new_database()
    replicas = [
        ServerProcess(url, tmp_path / f"log{i}", workers=1, replica=f"replica-{i}", **FAST).start()
        for i in range(2)
    ]
    try:
        for replica in replicas:
            replica.wait_ready()
        clients = [AutoshardClient(replica.url) for replica in replicas]
        jobs = [clients[i % 2].submit_plan({**MLP, "batch": 8 * (i + 1)}).job for i in range(6)]
        for job in jobs:
            assert clients[0].wait(job["id"], timeout_s=120)["state"] == "succeeded"
        with create_engine(url).connect() as connection:
            rows = connection.execute(text("SELECT id, attempts, claimed_by, state FROM jobs")).all()
            plans = connection.execute(text("SELECT count(*) FROM plans")).scalar()
        assert len(rows) == 6 and plans == 6
        assert all(attempts == 1 and state == "succeeded" for _, attempts, _, state in rows)
        assert {claimed.split("/")[0] for _, _, claimed, _ in rows} == {"replica-0", "replica-1"}
        for client in clients:
            client.close()
    finally:
        for replica in replicas:
            replica.stop()


def test_the_cli_does_not_load_the_service_stack_for_other_commands() -> None:
    probe = (
        "import sys, service.cli; "
        "print([m for m in ('fastapi', 'sqlalchemy', 'uvicorn', 'alembic', 'httpx') if m in sys.modules])"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
