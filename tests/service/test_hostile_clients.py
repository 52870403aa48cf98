"""A real ``autoshard serve`` (tokens of three principals, a checker and a worker process) under the
attacks of a hostile or careless client: every probe is answered 4xx naming its field, never a 5xx, never
with a server file's content or path; large documents are checked off the event loop; tenants are kept
apart; identical submissions at once become one job; a killed server leaves no process behind. Each
probe also asserts that ``/healthz``, polled from a process of its own, answered within 100 ms meanwhile."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.latency import HealthWatch
from tests.service.server import ServerProcess, command_line, session_processes
from tests.strategies.graph.graph_documents import SMALL_LLAMA

ALICE, ALICE_LAPTOP, BOB, ADMIN = (
    "alice-token-0001",
    "alice-laptop-0002",
    "bob-token-0003",
    "admin-token-0004",
)
TOKENS = {
    ALICE: ["read", "submit", "principal:alice"],
    ALICE_LAPTOP: ["read", "principal:alice"],
    BOB: ["read", "submit"],
    ADMIN: ["read", "submit", "admin", "metrics"],
}
FAST = {"poll_s": 0.2, "heartbeat_s": 0.5, "lease_s": 3}
HEALTHZ_LIMIT_S = 0.1
MLP = {"model": "mlp", "options": {"d": 8, "h": 8}, "mesh": {"shape": [2]}, "solver": {"time_limit_s": 5}}
SECRET_YAML = "api_key: [unclosed\nnode_size: 4\n"
SECRET_JSON = '{"node_size": "s3cr3t-value"}'


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        f"sqlite:///{folder / 'autoshard.db'}",
        folder / "log",
        workers=1,
        tokens=TOKENS,
        search_dir=folder / "searches",
        **FAST,
    )
    process.start().wait_ready()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def health(server: ServerProcess, folder: Path) -> Iterator[HealthWatch]:
    watch = HealthWatch(server.port, folder)
    yield watch
    watch.stop()


@pytest.fixture(scope="module")
def secrets(folder: Path) -> dict[str, Path]:
    files = {"yaml": folder / "secret.yaml", "json": folder / "secret.json"}
    files["yaml"].write_text(SECRET_YAML)
    files["json"].write_text(SECRET_JSON)
    return files


@pytest.fixture(scope="module")
def big_graph() -> dict[str, Any]:
    """A launcher's graph of a 16-layer Llama captured whole (about 0.8 MB, ~3 s of CPU to check)."""
    from strategies.graph.export import graph_json
    from strategies.plan.planner import PlanRequest, export_request_graph

    request = PlanRequest(
        model="llama3-8b", mesh="2", layers=16, batch=2, seq=16, options=SMALL_LLAMA, captured_layers=None
    )
    return json.loads(graph_json(export_request_graph(request)))


def post(server: ServerProcess, path: str, body: Any, token: str = ALICE, **params: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{server.url}{path}", content=content, headers=headers(token), params=params, timeout=120
    )


def job_count(server: ServerProcess) -> int:
    return httpx.get(f"{server.url}/v1/jobs", headers=headers(ADMIN), timeout=30).json()["total"]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def raw(template: dict[str, Any], replace: dict[str, str]) -> bytes:
    """``template`` as JSON with placeholder strings replaced by raw text (``NaN``, ``Infinity``, ``1e400``:
    numbers standard JSON cannot carry but a parser may take)."""
    text = json.dumps(template)
    for placeholder, value in replace.items():
        text = text.replace(f'"{placeholder}"', value)
    return text.encode()


IOPDDL = {"problem": {"nodes": {"intervals": [[0, 1]], "costs": [[1, 2]], "usages": [[1, 1]]}, "edges": {}}}
SEARCH = {"model": "mlp", "options": {"d": 8, "h": 8}, "devices": 4, "solver": {"time_limit_s": 5}}
PROBES: list[tuple[str, str, Any, dict[str, Any], str, str]] = [
    # (name, path, body, query, field, a fragment of the message)
    ("hardware yaml path", "/v1/plans", {**MLP, "hardware": "SECRET.yaml"}, {}, "hardware", "preset"),
    ("hardware json path", "/v1/plans", {**MLP, "hardware": "SECRET.json"}, {}, "hardware", "preset"),
    (
        "hardware base path",
        "/v1/plans",
        {**MLP, "hardware": {"base": "SECRET.yaml"}},
        {},
        "hardware.base",
        "preset",
    ),
    ("search hardware path", "/v1/searches", {**SEARCH, "hardware": "SECRET.yaml"}, {}, "hardware", "preset"),
    ("solve unknown field", "/v1/solve", {**IOPDDL, "junk": 1}, {}, "junk", "unknown field"),
    (
        "solve unknown nested field",
        "/v1/solve",
        {"problem": {**IOPDDL["problem"], "x": nested(20)}},
        {},
        "problem.x",
        "unknown field",
    ),
    ("solve field nested 950 deep", "/v1/solve", {**IOPDDL, "junk": nested(950)}, {}, "body", "recursion"),
    ("plan unknown field", "/v1/plans", {**MLP, "junk": nested(100)}, {}, "junk", "unknown field"),
    (
        "memory Infinity",
        "/v1/plans",
        raw({**MLP, "memory_gib": "X"}, {"X": "Infinity"}),
        {},
        "memory_gib",
        "finite",
    ),
    (
        "memory 1e400",
        "/v1/plans",
        raw({**MLP, "memory_gib": "X"}, {"X": "1e400"}),
        {},
        "memory_gib",
        "finite",
    ),
    (
        "time limit Infinity",
        "/v1/plans",
        raw({**MLP, "solver": {"time_limit_s": "X"}}, {"X": "Infinity"}),
        {},
        "solver.time_limit_s",
        "finite",
    ),
    ("option NaN", "/v1/plans", raw({**MLP, "options": {"d": "X"}}, {"X": "NaN"}), {}, "options.d", "finite"),
    ("graph nested 40 deep", "/v1/plans", {**MLP, "model": None, "graph": nested(40)}, {}, "graph", "nested"),
    (
        "graph nested 600 deep",
        "/v1/plans",
        {**MLP, "model": None, "graph": nested(600)},
        {},
        "body",
        "recursion",
    ),
    (
        "graph 1e400",
        "/v1/plans",
        raw({**MLP, "model": None, "graph": {"a": "X"}}, {"X": "1e400"}),
        {},
        "graph",
        "non-finite",
    ),
    ("hardware nested 600 deep", "/v1/plans", {**MLP, "hardware": nested(600)}, {}, "body", "recursion"),
    (
        "hardware unknown figure",
        "/v1/plans",
        {**MLP, "hardware": {"warp_drive": "x"}},
        {},
        "hardware.warp_drive",
        "unknown field",
    ),
    (
        "hardware NaN",
        "/v1/plans",
        raw({**MLP, "hardware": {"inter_node": {"bandwidth": "X"}}}, {"X": "NaN"}),
        {},
        "hardware.inter_node.bandwidth",
        "finite",
    ),
    (
        "hardware memory 2**70",
        "/v1/plans",
        {**MLP, "hardware": {"memory_bytes": 2**70}},
        {},
        "hardware.memory_bytes",
        "less than or equal",
    ),
    (
        "n_heads 0",
        "/v1/plans",
        {**MLP, "model": "llama3-8b", "options": {"n_heads": 0}},
        {},
        "options.n_heads",
        "",
    ),
    (
        "vocab 0",
        "/v1/plans",
        {**MLP, "model": "gpt2-small", "options": {"vocab_size": 0}},
        {},
        "options.vocab_size",
        "",
    ),
    ("mlp h -1", "/v1/plans", {**MLP, "options": {"h": -1}}, {}, "options.h", ""),
    ("mlp d 2**70", "/v1/plans", {**MLP, "options": {"d": 2**70}}, {}, "options.d", ""),
    ("unknown option", "/v1/plans", {**MLP, "options": {"nope": 1}}, {}, "options.nope", ""),
    (
        "pin unknown parameter",
        "/v1/plans",
        {**MLP, "pinned": {"parameters": {"w9.weight": ["S(0)"]}}},
        {},
        "pinned.parameters.w9.weight",
        "no such parameter",
    ),
    (
        "pin unknown input",
        "/v1/plans",
        {**MLP, "pinned": {"inputs": {"5": ["R"]}}},
        {},
        "pinned.inputs.5",
        "no input 5",
    ),
    (
        "pin a dim too far",
        "/v1/plans",
        {**MLP, "pinned": {"parameters": {"w1.weight": ["S(7)"]}}},
        {},
        "pinned.parameters.w1.weight",
        "shards a dim",
    ),
    (
        "solve pins 1e400",
        "/v1/solve",
        raw({"problem": {**IOPDDL["problem"], "pins": {"0": "X"}}}, {"X": "1e400"}),
        {},
        "body",
        "non-finite",
    ),
    (
        "solve pins 1.5",
        "/v1/solve",
        {"problem": {**IOPDDL["problem"], "pins": {"0": 1.5}}},
        {},
        "problem.pins",
        "",
    ),
    ("solve time limit inf", "/v1/solve", IOPDDL, {"time_limit_s": "inf"}, "time_limit_s", "finite"),
    ("search unknown option", "/v1/searches", {**SEARCH, "options": {"nope": 1}}, {}, "options.nope", ""),
    (
        "search of 7 days",
        "/v1/searches",
        {**SEARCH, "devices": 4096, "batch_sizes": list(range(1, 17)), "solver": {"time_limit_s": 600}},
        {},
        "batch_sizes",
        "candidates",
    ),
    (
        "search of 26 hours",
        "/v1/searches",
        {**SEARCH, "devices": 8, "batch_sizes": list(range(1, 17)), "solver": {"time_limit_s": 600}},
        {},
        "solver.time_limit_s",
        "solver seconds",
    ),
]


@pytest.mark.alone
@pytest.mark.parametrize(
    ("name", "path", "body", "query", "field", "fragment"), PROBES, ids=[p[0] for p in PROBES]
)
def test_every_probe_is_refused_naming_its_field(
    server: ServerProcess,
    health: HealthWatch,
    secrets: dict[str, Path],
    name: str,
    path: str,
    body: Any,
    query: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    if not isinstance(body, bytes):
        body = (
            json.dumps(body)
            .replace("SECRET.yaml", str(secrets["yaml"]))
            .replace("SECRET.json", str(secrets["json"]))
        )
        body = body.encode()
    before = job_count(server)
    with health.window() as window:
        response = post(server, path, body, **query)
    assert response.status_code == 422, (name, response.status_code, response.text)
    answer = response.json()
    assert answer["field"] == field, answer
    assert fragment in answer["detail"], answer
    for leak in (
        "api_key",
        "unclosed",
        "s3cr3t",
        str(secrets["yaml"].parent),
        "Traceback",
        "Exception raised",
    ):
        assert leak not in response.text, (leak, response.text)
    assert job_count(server) == before
    assert window.worst_s < HEALTHZ_LIMIT_S, window.samples


def test_a_path_tells_nothing_of_the_servers_files(server: ServerProcess, secrets: dict[str, Path]) -> None:
    answers = {
        str(path): post(server, "/v1/plans", {**MLP, "hardware": str(path)}).json()
        for path in (secrets["yaml"], secrets["json"], secrets["yaml"].parent / "missing.yaml", "../x.json")
    }
    assert len({answer["detail"] for answer in answers.values()}) == 1, answers  # existing or not, the same


def test_a_body_with_a_10_mib_junk_field_is_refused_and_not_stored(
    server: ServerProcess, folder: Path
) -> None:
    database = folder / "autoshard.db"
    size = sum(path.stat().st_size for path in folder.glob("autoshard.db*"))
    for _ in range(5):
        response = post(server, "/v1/solve", {**IOPDDL, "junk": "x" * 10 * 2**20})
        assert response.status_code == 422 and response.json()["field"] == "junk"
    assert database.exists()
    assert sum(path.stat().st_size for path in folder.glob("autoshard.db*")) - size < 2**20


@pytest.mark.alone
def test_large_graphs_are_checked_off_the_event_loop(
    server: ServerProcess, health: HealthWatch, big_graph: dict[str, Any]
) -> None:
    bodies = [
        json.dumps({"graph": big_graph, "mesh": {"shape": [2]}, "memory_gib": 40 + i}).encode()
        for i in range(3)
    ]
    answers: list[httpx.Response] = []
    with health.window(min_samples=50) as window:
        answers.append(post(server, "/v1/plans", bodies[0]))
        threads = [
            threading.Thread(target=lambda b=b: answers.append(post(server, "/v1/plans", b)))
            for b in bodies[1:]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cached = httpx.get(f"{server.url}/v1/jobs", headers=headers(ALICE), timeout=30)
    assert [answer.status_code for answer in answers] == [202, 202, 202], [a.text for a in answers]
    assert cached.status_code == 200
    assert window.worst_s < HEALTHZ_LIMIT_S, sorted(window.samples)[-5:]


@pytest.mark.alone
def test_a_deep_built_in_model_is_checked_off_the_event_loop(
    server: ServerProcess, health: HealthWatch
) -> None:
    request = {"model": "llama3-70b", "layers": 1024, "mesh": {"shape": [8, 8]}, "memory_gib": 1}
    with health.window() as window:
        response = post(server, "/v1/plans", request)
    assert response.status_code == 422 and response.json()["field"] == "memory_gib", response.text
    assert window.worst_s < HEALTHZ_LIMIT_S, sorted(window.samples)[-5:]


def wait_done(server: ServerProcess, job: dict[str, Any], token: str = ALICE) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while job["state"] not in ("succeeded", "failed", "canceled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
        job = httpx.get(f"{server.url}/v1/jobs/{job['id']}", headers=headers(token), timeout=30).json()
    return job


def test_tenants_see_read_and_cancel_only_their_own(server: ServerProcess) -> None:
    request = {**MLP, "batch": 6}
    mine = wait_done(server, post(server, "/v1/plans", request).json())
    assert mine["state"] == "succeeded", mine
    plan_url, job_url = f"{server.url}{mine['plan_url']}", f"{server.url}/v1/jobs/{mine['id']}"
    for token, status in ((ALICE, 200), (ALICE_LAPTOP, 200), (ADMIN, 200), (BOB, 404)):
        assert httpx.get(plan_url, headers=headers(token)).status_code == status, token
        assert httpx.get(job_url, headers=headers(token)).status_code == status, token
    assert httpx.delete(job_url, headers=headers(BOB)).status_code == 404
    listed = httpx.get(f"{server.url}/v1/jobs", headers=headers(BOB), params={"limit": 500}).json()["items"]
    assert mine["id"] not in {job["id"] for job in listed}
    assert (
        httpx.post(f"{server.url}/v1/plans", json=request, headers=headers(ALICE)).status_code == 200
    )  # cached
    theirs = post(server, "/v1/plans", request, token=BOB)
    assert theirs.status_code == 202 and theirs.json()["id"] != mine["id"]  # no answer from alice's plan
    assert wait_done(server, theirs.json(), BOB)["state"] == "succeeded"
    assert httpx.get(plan_url, headers=headers(BOB)).status_code == 200  # bob's own job made it his
    search = post(server, "/v1/searches", {**SEARCH, "devices": 2, "batch_sizes": [4]}).json()
    assert httpx.get(f"{server.url}/v1/searches/{search['id']}", headers=headers(BOB)).status_code == 404
    assert httpx.delete(f"{server.url}/v1/jobs/{search['id']}", headers=headers(BOB)).status_code == 404
    done = wait_done(server, search)
    assert done["state"] == "succeeded", done
    assert httpx.get(f"{server.url}/v1/searches/{search['id']}", headers=headers(ALICE_LAPTOP)).json()[
        "results"
    ]


def test_metrics_and_the_detailed_readiness_need_their_scope(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.get(f"{server.url}/metrics", headers=headers(ALICE)).status_code == 403
    assert "autoshard_jobs" in httpx.get(f"{server.url}/metrics", headers=headers(ADMIN)).text
    bare = httpx.get(f"{server.url}/readyz").json()
    assert bare == {"status": "ready"}
    detailed = httpx.get(f"{server.url}/readyz", headers=headers(ADMIN)).json()
    assert detailed["status"] == "ready" and detailed["worker_processes"]
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}


def test_identical_submissions_at_once_become_one_job(server: ServerProcess) -> None:
    request = {**MLP, "batch": 10, "solver": {"time_limit_s": 7}}
    before = job_count(server)
    answers: list[httpx.Response] = []
    start = threading.Barrier(4)

    def submit() -> None:
        start.wait()
        answers.append(post(server, "/v1/plans", request))

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {answer.status_code for answer in answers} <= {200, 202}
    ids = {answer.json()["id"] for answer in answers if answer.status_code == 202}
    assert len(ids) == 1 and job_count(server) == before + 1


def test_twenty_explain_requests_at_once_are_all_answered(server: ServerProcess) -> None:
    job = wait_done(server, post(server, "/v1/plans", {**MLP, "batch": 12}).json())
    plan = httpx.get(f"{server.url}{job['plan_url']}", headers=headers(ALICE)).json()
    targets = [*plan["parameters"], *(node["name"] for node in plan["nodes"])][:20]
    answers: dict[str, int] = {}

    def explain(target: str) -> None:
        url = f"{server.url}/v1/plans/{job['problem_hash']}/explain"
        answers[target] = httpx.get(
            url, params={"target": target}, headers=headers(ALICE), timeout=120
        ).status_code

    threads = [threading.Thread(target=explain, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(answers.values()) == {200}, answers
    url = f"{server.url}/v1/plans/{job['problem_hash']}/explain"
    assert httpx.get(url, params={"target": targets[0]}, headers=headers(BOB)).status_code == 404


def test_a_killed_server_leaves_no_process_behind(server: ServerProcess) -> None:
    """Last: it kills the module's server."""
    job = wait_done(server, post(server, "/v1/plans", {**MLP, "batch": 14}).json())  # a checker and a worker
    explain = f"{server.url}/v1/plans/{job['problem_hash']}/explain"
    assert (
        httpx.get(explain, params={"target": "w1.weight"}, headers=headers(ALICE), timeout=120).status_code
        == 200
    )
    assert server.process is not None
    children = session_processes(server.process.pid) - {server.process.pid}
    assert len(children) >= 4, children  # worker, checker, explain, resource tracker
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    # A child notices within half a second once it runs its own code, but one the server had just spawned is
    # still importing torch then (10+ s on two loaded cores, seen in the suite): it leaves after its imports.
    deadline = time.monotonic() + 60
    while left := session_processes(server.process.pid):
        assert time.monotonic() < deadline, {pid: command_line(pid) for pid in left}
        time.sleep(0.1)
