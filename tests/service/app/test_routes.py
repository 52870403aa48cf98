"""The API with FastAPI's TestClient and no workers: submissions, jobs, paging, reference data, health,
metrics, and every class of bad input answered with its 4xx (the 422s name the field)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.store import jobs as job_store
from service.store import plans as plan_store
from tests.bundled_data import EXAMPLE
from tests.service.app.conftest import MLP
from tests.strategies.graph.graph_documents import exported_text


def test_a_new_plan_request_is_accepted_as_a_job(client: TestClient) -> None:
    response = client.post("/v1/plans", json=MLP)
    assert response.status_code == 202
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] == "queued" and job["plan_url"] is None and len(job["problem_hash"]) == 64
    assert client.get(response.headers["location"]).json()["id"] == job["id"]


def test_the_same_problem_joins_its_job_and_another_gets_a_new_one(client: TestClient) -> None:
    first = client.post("/v1/plans", json=MLP).json()
    same = client.post(
        "/v1/plans", json={**MLP, "batch": None, "dtype": "bfloat16"}
    ).json()  # defaults spelt out
    other = client.post("/v1/plans", json={**MLP, "batch": 64}).json()
    assert same["id"] == first["id"]
    assert other["id"] != first["id"] and other["problem_hash"] != first["problem_hash"]


def test_a_stored_plan_is_answered_200_from_the_cache(client: TestClient) -> None:
    job = client.post("/v1/plans", json=MLP).json()
    store = client.app.state.store
    with store.session() as session:
        plan_store.save_plan(
            session, job["problem_hash"], "plan", {"version": 1, "marker": 7}, job["id"], 0.1, "anonymous"
        )
    response = client.post("/v1/plans", json=MLP)
    assert response.status_code == 200 and response.json() == {"version": 1, "marker": 7}
    assert response.headers["content-location"] == f"/v1/plans/{job['problem_hash']}"
    assert client.get(f"/v1/plans/{job['problem_hash']}").json()["marker"] == 7
    metrics = client.get("/metrics").text
    assert 'autoshard_plan_cache_hits_total{kind="plan"} 1.0' in metrics
    assert 'autoshard_plan_cache_misses_total{kind="plan"} 1.0' in metrics


def test_delete_cancels_a_queued_job(client: TestClient) -> None:
    job = client.post("/v1/plans", json=MLP).json()
    canceled = client.delete(f"/v1/jobs/{job['id']}")
    assert canceled.status_code == 200 and canceled.json()["state"] == "canceled"
    assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == "canceled"
    assert client.post("/v1/plans", json=MLP).json()["id"] != job["id"]  # a canceled job is not joined


def test_jobs_are_listed_newest_first_in_pages(client: TestClient) -> None:
    ids = [client.post("/v1/plans", json={**MLP, "batch": b}).json()["id"] for b in (8, 16, 32)]
    page = client.get("/v1/jobs", params={"limit": 2}).json()
    rest = client.get("/v1/jobs", params={"limit": 2, "offset": 2}).json()
    assert page["total"] == 3 and [j["id"] for j in page["items"] + rest["items"]] == ids[::-1]
    assert client.get("/v1/jobs", params={"state": "succeeded"}).json()["total"] == 0


def test_a_bare_iopddl_problem_is_a_job_too(client: TestClient) -> None:
    document = json.loads(EXAMPLE.read_text())
    response = client.post("/v1/solve", json=document, params={"time_limit_s": 5})
    assert response.status_code == 202 and response.json()["kind"] == "solve"
    again = client.post("/v1/solve", json=document, params={"time_limit_s": 5}).json()
    assert again["id"] == response.json()["id"]


def test_models_and_hardware_are_listed(client: TestClient) -> None:
    models = {m["name"]: m for m in client.get("/v1/models").json()}
    assert {"mlp", "gpt2-small", "llama3-8b"} <= set(models)
    assert models["mlp"]["options"] == {"d": 1024, "h": 4096} and models["llama3-8b"]["layers"] == 32
    hardware = client.get("/v1/hardware").json()
    assert hardware["h100"]["memory_bytes"] == 80 * 2**30 and "cpu" in hardware


def test_health_ready_and_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["problems"] == []
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/plans", "/v1/jobs/{job_id}", "/v1/solve", "/v1/plans/{problem_hash}/explain"} <= set(paths)


def test_metrics_report_jobs_by_state_queue_depth_and_latency(client: TestClient) -> None:
    client.post("/v1/plans", json=MLP)
    text = client.get("/metrics").text
    assert 'autoshard_jobs{state="queued"} 1.0' in text and "autoshard_queue_depth 1.0" in text
    assert (
        'autoshard_http_request_duration_seconds_count{method="POST",route="/v1/plans",status="202"} 1.0'
        in text
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**MLP, "model": "resnet-9000"}, "model"),
        ({**MLP, "model": "./evil.py:factory"}, "model"),
        ({"mesh": {"shape": [4]}}, "model"),
        ({**MLP, "mesh": {"shape": [0, 4]}}, "mesh.shape[0]"),
        ({**MLP, "mesh": {"shape": [2, 4], "axis_names": ["dp"]}}, "mesh.axis_names"),
        ({**MLP, "mesh": {"shape": []}}, "mesh.shape"),
        ({**MLP, "mesh": {"shape": ["four"]}}, "mesh.shape[0]"),
        ({**MLP, "memory_gib": 0.001}, "memory_gib"),
        ({**MLP, "memory_gib": -1}, "memory_gib"),
        ({**MLP, "options": {"depth": 3}}, "options.depth"),
        ({**MLP, "hardware": "tpu9"}, "hardware"),
        ({**MLP, "hardware": {"base": "h100", "warp_drive": 1}}, "hardware.warp_drive"),
        ({**MLP, "hardware": {"base": "h100", "matmul_efficiency": 1.5}}, "hardware.matmul_efficiency"),
        ({**MLP, "hardware": {"base": "h100", "overlap_slowdown": -1}}, "hardware.overlap_slowdown"),
        ({**MLP, "solver": {"backend": "gurobi"}}, "solver.backend"),
        ({**MLP, "solver": {"time_limit_s": 10**6}}, "solver.time_limit_s"),
        ({**MLP, "pinned": {"inputs": {"0": ["S(0)", "R"]}}}, "pinned.inputs.0"),
        ({**MLP, "pinned": {"inputs": {"0": ["Q(7)"]}}}, "pinned.inputs.0"),
        ({**MLP, "colour": "blue"}, "colour"),
        ({**MLP, "recompute": "sometimes"}, "recompute"),
        ({**MLP, "model": None, "graph": {"version": 1, "nodes": []}}, "graph.format"),
        ({**MLP, "model": None, "graph": [1, 2]}, "graph"),
        ({**MLP, "graph": {"version": 1}}, "model"),
        ({"mesh": {"shape": [4]}, "graph": {"version": 1}, "batch": 8}, "batch"),
    ],
)
def test_bad_plan_requests_get_422_naming_the_field(client: TestClient, body: dict, field: str) -> None:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field, response.json()
    assert response.json()["detail"].startswith(field)


def test_malformed_json_gets_422_naming_the_body(client: TestClient) -> None:
    response = client.post(
        "/v1/plans", content=b'{"model": "mlp",', headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and response.json()["field"] == "body"


def test_a_bad_iopddl_problem_gets_422_naming_its_field(client: TestClient) -> None:
    response = client.post("/v1/solve", json={"problem": {"nodes": {"costs": [[1, "x"]]}}})
    assert response.status_code == 422 and response.json()["field"].startswith("problem.nodes.costs")


def test_a_graph_larger_than_the_limit_gets_413(make_client) -> None:
    client = make_client(max_graph_bytes=1024)
    graph = {"version": 1, "nodes": [{"op": "aten.mm.default"}] * 100}
    response = client.post("/v1/plans", json={**MLP, "model": None, "graph": graph})
    assert response.status_code == 413 and response.json()["field"] == "graph"
    assert "limit of 1024" in response.json()["detail"]


def test_a_launchers_graph_is_accepted_and_a_bad_one_refused_naming_its_field(client: TestClient) -> None:
    document = json.loads(exported_text("mlp"))
    body = {"graph": document, "mesh": {"shape": [4]}, "solver": {"time_limit_s": 5}}
    accepted = client.post("/v1/plans", json=body)
    assert accepted.status_code == 202, accepted.text
    evil = json.loads(exported_text("mlp"))
    evil["nodes"][-1]["op"] = "os.system"
    refused = client.post("/v1/plans", json={**body, "graph": evil})
    assert refused.status_code == 422 and refused.json()["field"].startswith("graph.nodes[")
    assert "os.system" in refused.json()["detail"]


def test_a_body_over_the_limit_gets_413(make_client) -> None:
    client = make_client(max_body_bytes=4096)
    response = client.post("/v1/plans", json={**MLP, "options": {f"o{i}": i for i in range(2000)}})
    assert response.status_code == 413 and response.json()["field"] == "body"
    chunked = client.post("/v1/plans", content=iter([b"{" + b" " * 3000, b" " * 3000 + b"}"]))
    assert chunked.status_code == 413


def test_unknown_jobs_and_plans_get_404(client: TestClient) -> None:
    assert client.get("/v1/jobs/no-such-job").status_code == 404
    assert client.delete("/v1/jobs/no-such-job").status_code == 404
    assert client.get(f"/v1/plans/{'0' * 64}").status_code == 404
    assert client.get(f"/v1/plans/{'0' * 64}/explain", params={"target": "w1.weight"}).status_code == 404
    assert client.get("/v1/plans/not-a-hash").status_code == 422


def test_a_full_queue_gets_429_with_retry_after(make_client) -> None:
    client = make_client(max_live_jobs=2, retry_after_s=7)
    assert [client.post("/v1/plans", json={**MLP, "batch": b}).status_code for b in (8, 16)] == [202, 202]
    full = client.post("/v1/plans", json={**MLP, "batch": 32})
    assert full.status_code == 429 and full.headers["retry-after"] == "7"
    assert client.post("/v1/plans", json={**MLP, "batch": 8}).status_code == 202  # joining a job is free


def test_the_queue_bound_counts_running_jobs_too(make_client) -> None:
    client = make_client(max_live_jobs=1)
    job = client.post("/v1/plans", json=MLP).json()
    with client.app.state.store.session() as session:
        assert job_store.claim_next_job(session, "elsewhere/0", lease_s=600).id == job["id"]
    assert client.post("/v1/plans", json={**MLP, "batch": 16}).status_code == 429


def test_a_principals_live_work_is_capped(make_client) -> None:
    tokens = {"a": ["read", "submit"], "b": ["read", "submit"]}
    client = make_client(tokens=tokens, max_principal_solver_s=12, max_principal_candidates=3)
    a, b = ({"Authorization": f"Bearer {token}"} for token in ("a", "b"))
    assert client.post("/v1/plans", json=MLP, headers=a).status_code == 202  # 5 solver seconds
    assert client.post("/v1/plans", json={**MLP, "batch": 16}, headers=a).status_code == 202  # 10
    over = client.post("/v1/plans", json={**MLP, "batch": 32}, headers=a)
    assert (
        over.status_code == 429 and "solver seconds" in over.json()["detail"] and over.headers["retry-after"]
    )
    assert client.post("/v1/plans", json={**MLP, "batch": 32}, headers=b).status_code == 202  # b's own caps
    small = {**MLP, "batch": 64, "solver": {"time_limit_s": 1}}
    assert client.post("/v1/plans", json=small, headers=a).status_code == 202  # 3 jobs, 11 s
    fourth = client.post("/v1/plans", json={**small, "batch": 128}, headers=a)
    assert fourth.status_code == 429 and "candidates" in fourth.json()["detail"]


@pytest.mark.parametrize(
    ("search", "field", "fragment"),
    [
        ({"devices": 4096, "batch_sizes": list(range(1, 17))}, "batch_sizes", "candidates"),
        (
            {"devices": 8, "batch_sizes": list(range(1, 17)), "solver": {"time_limit_s": 600}},
            "solver.time_limit_s",
            "solver seconds",
        ),
        ({"devices": 8, "solver": {"time_limit_s": 601}}, "solver.time_limit_s", "at most 600"),
        ({"devices": 8, "hardware": "hw.yaml"}, "hardware", "not a preset"),
        ({"devices": 8, "options": {"width": 3}}, "options.width", ""),
        ({"devices": 8, "model": "resnet"}, "model", "unknown model"),
    ],
)
def test_searches_past_a_cap_or_wrong_get_422(
    client: TestClient, search: dict, field: str, fragment: str
) -> None:
    response = client.post("/v1/searches", json={"model": "mlp", **search})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field and fragment in response.json()["detail"], response.json()


def test_the_same_search_submitted_again_joins_the_running_one(client: TestClient) -> None:
    search = {"model": "mlp", "devices": 4, "batch_sizes": [8, 16]}
    first = client.post("/v1/searches", json=search)
    assert first.status_code == 202 and first.headers["location"] == f"/v1/searches/{first.json()['id']}"
    assert client.post("/v1/searches", json=search).json()["id"] == first.json()["id"]
    assert client.post("/v1/searches", json={**search, "devices": 8}).json()["id"] != first.json()["id"]


def test_a_full_queue_answers_a_search_as_it_answers_a_plan(make_client) -> None:
    search = {"model": "mlp", "devices": 4, "batch_sizes": [8, 16]}
    for first in ("/v1/plans", "/v1/searches"):  # the queue filled by a plan, then by a search
        client = make_client(max_live_jobs=1, retry_after_s=7)
        assert client.post(first, json=MLP if first == "/v1/plans" else search).status_code == 202
        plan = client.post("/v1/plans", json={**MLP, "batch": 16})
        refused = client.post("/v1/searches", json={**search, "devices": 8})
        assert plan.status_code == refused.status_code == 429
        assert refused.json() == plan.json() and "the queue is full" in plan.json()["detail"]
        assert refused.headers["retry-after"] == plan.headers["retry-after"] == "7"


def test_a_searchs_problem_hash_is_the_content_hash_of_its_request(client: TestClient) -> None:
    from service.intake import read_search

    search = {"model": "mlp", "devices": 4, "batch_sizes": [8, 16]}

    def key(body: dict) -> str:
        return read_search(json.dumps(body).encode()).key

    assert key(search) == key(dict(reversed(search.items())))  # the order of the fields
    assert key(search) == key({**search, "hardware": "h100", "prune": True, "solver": {"backend": "auto"}})
    changed = [
        {"devices": 8},
        {"batch_sizes": [16, 8]},
        {"hardware": "a100"},
        {"options": {"d": 16}},
        {"solver": {"time_limit_s": 5}},
        {"max_mesh_dims": 2},
        {"prune": False},
    ]
    assert len({key(search), *(key({**search, **change}) for change in changed)}) == 1 + len(changed)
    job = client.post("/v1/searches", json=search).json()
    assert client.get(f"/v1/jobs/{job['id']}").json()["problem_hash"] == key(search)


def test_a_token_configuration_with_an_unknown_scope_stops_the_server() -> None:
    from pydantic import ValidationError

    from service.settings import Settings

    with pytest.raises(ValidationError, match="unknown scope 'wrte'"):
        Settings(tokens={"a-long-token": ["read", "wrte"]})


def test_tokens_gate_reading_and_submitting(make_client) -> None:
    client = make_client(tokens={"writer-token": ["read", "submit"], "reader-token": ["read"]})
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    reader = {"Authorization": "Bearer reader-token"}
    writer = {"Authorization": "Bearer writer-token"}
    assert client.get("/v1/jobs", headers=reader).status_code == 200
    assert client.post("/v1/plans", json=MLP, headers=reader).status_code == 403
    assert client.post("/v1/plans", json=MLP, headers=writer).status_code == 202
    assert client.get("/healthz").status_code == 200  # probes need no token


def test_an_internal_error_answers_500_without_a_trace(client: TestClient, monkeypatch) -> None:
    from service.store import jobs as job_store

    def broken(*_args: object) -> None:
        raise RuntimeError("secret detail of a bug")

    monkeypatch.setattr(job_store, "list_jobs", broken)
    response = client.get("/v1/jobs", headers={"X-Request-ID": "launcher-42"})
    assert response.status_code == 500
    assert "secret" not in response.text and "Traceback" not in response.text
    assert response.headers["x-request-id"] == "launcher-42" and "launcher-42" in response.json()["detail"]


def test_every_answer_carries_a_request_id(client: TestClient) -> None:
    first, second = client.get("/healthz"), client.get("/healthz", headers={"X-Request-ID": "bad id!"})
    assert len(first.headers["x-request-id"]) == 16 and second.headers["x-request-id"] != "bad id!"


def test_cors_is_off_unless_origins_are_set(make_client) -> None:
    preflight = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in make_client().options("/v1/plans", headers=preflight).headers
    allowed = make_client(cors_origins=["https://example.org"]).options("/v1/plans", headers=preflight)
    assert allowed.headers["access-control-allow-origin"] == "https://example.org"


def test_a_request_may_replace_the_achieved_rates_of_its_hardware() -> None:
    from service.planning import service_hardware
    from service.submissions import PlanSubmission, hardware_document

    figures = {"base": "h100", "attention_efficiency": 0.65, "overlap_slowdown": 0, "sm_count": 144}
    submission = PlanSubmission.model_validate({**MLP, "hardware": figures})
    hardware = service_hardware(hardware_document(submission.hardware))
    assert (hardware.attention_efficiency, hardware.overlap_slowdown, hardware.sm_count) == (0.65, 0.0, 144)
