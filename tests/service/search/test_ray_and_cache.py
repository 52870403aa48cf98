"""The Ray executor gives the process pool's results; plans are shared with the service's plan cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app.main import create_app
from service.search.runner import run_search, search_candidates
from service.settings import Settings
from tests.service.search.conftest import mlp_search


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def step_times(results: dict) -> list[tuple[str, float, str]]:
    return [(row["id"], row["step_time_s"], row["status"]) for row in results["candidates"]]


def test_the_ray_executor_gives_the_ranking_of_the_process_pool(
    local_ray, mlp_results, tmp_path: Path
) -> None:
    _, pooled, _ = mlp_results
    on_ray = run_search(mlp_search(executor="ray"), tmp_path)
    assert on_ray["request"]["executor"] == "ray"
    assert step_times(on_ray) == step_times(pooled)
    assert on_ray["pareto"] == pooled["pareto"]
    assert (tmp_path / "plans" / f"{on_ray['candidates'][0]['id']}.json").exists()


def test_a_repeated_search_and_the_service_share_the_plan_cache(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'autoshard.db'}"
    request = mlp_search(batch_sizes=[64], workers=1)
    first = run_search(request, tmp_path / "first", cache_url=url)
    assert all(row["seconds"] > 0 for row in first["candidates"])

    class Count:
        reused = -1

        def started(self, total: int, reused: int) -> None:
            Count.reused = reused

        def finished(self, row: dict) -> None:
            pass

    again = run_search(request, tmp_path / "again", Count(), cache_url=url)
    assert Count.reused == len(first["candidates"]) == 4
    assert step_times(again) == step_times(first)
    assert all(row["seconds"] == 0 for row in again["candidates"])
    assert (tmp_path / "again" / "plans" / "c00.json").exists()

    candidate = search_candidates(request)[1]
    with TestClient(create_app(Settings(database_url=url, workers=0))) as client:
        answer = client.post("/v1/plans", json=request.service_submission(candidate))
    assert answer.status_code == 200  # the search's plan, from the service's cache: no job
    row = next(row for row in first["candidates"] if row["id"] == candidate.id)
    assert answer.json()["predicted"]["step_time_s"] == row["step_time_s"]
    assert answer.json()["mesh"]["shape"] == list(candidate.mesh)
