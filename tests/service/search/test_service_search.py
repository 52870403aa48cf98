"""``/v1/searches`` end to end on an app with a worker: submit, progress, results equal to the search run
here, the report (or 501 without the report module), and the plans it left in the service's cache."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.app.main import create_app
from service.search.report import page as report_page
from service.search.runner import run_search, search_candidates
from service.settings import Settings
from service.store.models import Plan, Search
from tests.service.search.conftest import MLP_OPTIONS, mlp_search

BODY = {
    "model": "mlp",
    "devices": 4,
    "batch_sizes": [64, 1024],
    "options": MLP_OPTIONS,
    "dtype": "float32",
    "solver": {"time_limit_s": 20, "gap": 0},
    "prune": False,  # every candidate planned to the end, to compare with planning it alone
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path]]:
    folder = tmp_path_factory.mktemp("service")
    settings = Settings(
        database_url=f"sqlite:///{folder / 'autoshard.db'}",
        workers=1,
        search_dir=str(folder / "searches"),
        poll_s=0.1,
        heartbeat_s=0.3,
        lease_s=5,
    )
    with TestClient(create_app(settings)) as client:
        yield client, folder / "searches"


def wait_done(client: TestClient, location: str, timeout_s: float = 150) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        search = client.get(location).json()
        if search["state"] in ("succeeded", "failed", "canceled"):
            return search
        time.sleep(0.2)
    raise AssertionError(f"the search did not finish in {timeout_s} s: {search}")


def test_a_search_runs_as_a_job_and_serves_its_results_and_report(
    service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, search_dir = service
    submitted = client.post("/v1/searches", json=BODY)
    assert submitted.status_code == 202
    location = submitted.headers["Location"]
    assert location == f"/v1/searches/{submitted.json()['id']}"
    assert client.get(f"{location}/report").status_code == 404  # not done yet

    search = wait_done(client, location)
    assert search["state"] == "succeeded", search
    assert search["progress"]["done"] == search["progress"]["total"] == 4
    assert search["progress"]["best"]["id"] == search["results"]["candidates"][0]["id"]

    here = run_search(mlp_search(devices=4, workers=1, time_limit_s=20.0), tmp_path)
    served = search["results"]
    assert [(r["id"], r["step_time_s"], r["rank"]) for r in served["candidates"]] == [
        (r["id"], r["step_time_s"], r["rank"]) for r in here["candidates"]
    ]
    assert (search_dir / search["id"] / "results.json").exists()

    report = client.get(f"{location}/report")
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    assert all(f">{row['id']}<" in report.text for row in served["candidates"])
    with monkeypatch.context() as patch:  # a service built without the report module says so
        patch.setattr(report_page, "report_renderer", lambda: None)
        missing = client.get(f"{location}/report")
    assert missing.status_code == 501 and "report module" in missing.json()["detail"]

    job = client.get(f"/v1/jobs/{search['id']}").json()
    assert job["kind"] == "search" and job["plan_url"] == location
    with client.app.state.store.session() as session:  # its results in searches, under its job
        stored = session.get(Search, search["id"])
        assert stored.problem_hash == job["problem_hash"] and json.loads(stored.document) == served
        assert session.scalar(select(func.count()).select_from(Plan).where(Plan.kind == "search")) == 0
    request = mlp_search(devices=4)
    candidate = search_candidates(request)[0]
    cached = client.post("/v1/plans", json=request.service_submission(candidate) | {"solver": BODY["solver"]})
    assert cached.status_code == 200  # the search stored its plans in the service's cache


def test_bad_searches_are_refused_naming_the_field(service) -> None:
    client, _ = service
    unknown = client.post("/v1/searches", json={**BODY, "model": "nope"})
    assert unknown.status_code == 422 and unknown.json()["field"] == "model"
    assert client.post("/v1/searches", json={**BODY, "max_mesh_dims": 5}).status_code == 422
    wide = client.post("/v1/searches", json={**BODY, "axis_limits": {"xp": 2}})
    assert wide.status_code == 422 and wide.json()["field"].startswith("axis_limits.xp")
    assert client.get("/v1/searches/no-such-search").status_code == 404


def test_a_search_over_four_axes_plans_pipelines_within_its_axis_limits(service) -> None:
    client, _ = service
    tiny = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "ffn_dim": 128, "max_seq_len": 64}
    body = {
        "model": "llama3-8b", "devices": 16, "batch_sizes": [8], "seq": 32, "layers": 4, "options": tiny,
        "dtype": "float32", "max_mesh_dims": 4, "axis_limits": {"pp": 2, "dp": 2, "cp": 2, "tp": 2},
        "solver": {"time_limit_s": 10},
    }  # fmt: skip
    submitted = client.post("/v1/searches", json=body)
    assert submitted.status_code == 202, submitted.json()
    search = wait_done(client, submitted.headers["Location"])
    assert search["state"] == "succeeded", search
    rows = {tuple(r["mesh"]): r for r in search["results"]["candidates"]}
    assert set(rows) == {(2, 2, 2, 2)}  # every axis at most 2: 16 devices need four axes
    pipelined = rows[(2, 2, 2, 2)]
    assert pipelined["axis_names"] == ["pp", "dp", "cp", "tp"]
    assert pipelined["status"] in ("optimal", "feasible"), pipelined["error"]
    assert pipelined["pipeline"]["microbatches"] in (2, 4, 8)
