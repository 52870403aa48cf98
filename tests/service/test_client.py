"""The launchers' client against scripted answers: retries on 429 after Retry-After and on connection
errors, gives up with the service's message, waits on a job with progress, fetches the plan."""

from __future__ import annotations

import time

import httpx
import pytest

from service.client import AutoshardClient, ServiceError

JOB = {"id": "j1", "state": "queued", "problem_hash": "ab" * 32, "progress": None, "error": None}


def scripted(*answers: object) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport answering each request with the next of ``answers`` (a Response, or an exception)."""
    queue = list(answers)
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handle), seen


def test_a_full_queue_is_retried_after_its_retry_after() -> None:
    transport, seen = scripted(
        httpx.Response(429, headers={"Retry-After": "1"}, json={"detail": "full", "field": None}),
        httpx.Response(202, json=JOB),
    )
    started = time.monotonic()
    with AutoshardClient("http://autoshard", token="t", transport=transport) as client:
        submission = client.submit_plan({"model": "mlp"})
    assert time.monotonic() - started >= 1.0
    assert not submission.cached and submission.job["id"] == "j1"
    assert [r.headers["authorization"] for r in seen] == ["Bearer t", "Bearer t"]


def test_connection_errors_are_retried_then_raised() -> None:
    transport, seen = scripted(httpx.ConnectError("refused"), httpx.Response(200, json={"version": 1}))
    with AutoshardClient("http://autoshard", transport=transport, backoff_s=0.01) as client:
        assert client.submit_plan({"model": "mlp"}).result == {"version": 1}
    assert len(seen) == 2
    transport, seen = scripted(*[httpx.ConnectError("refused")] * 3)
    client = AutoshardClient("http://autoshard", transport=transport, retries=2, backoff_s=0.01)
    with client, pytest.raises(httpx.ConnectError):
        client.job("j1")
    assert len(seen) == 3


def test_a_refusal_raises_with_the_service_message_and_field() -> None:
    transport, seen = scripted(
        httpx.Response(422, json={"detail": "model: unknown model 'x'", "field": "model"})
    )
    with (
        AutoshardClient("http://autoshard", transport=transport) as client,
        pytest.raises(ServiceError) as error,
    ):
        client.submit_plan({"model": "x"})
    assert error.value.status == 422 and error.value.field == "model" and len(seen) == 1


def test_plan_waits_with_progress_then_fetches_the_plan() -> None:
    running = {**JOB, "state": "running", "progress": {"phase": "solve", "gap": 0.5}}
    done = {**JOB, "state": "succeeded", "plan_url": f"/v1/plans/{JOB['problem_hash']}"}
    transport, seen = scripted(
        httpx.Response(202, json=JOB),
        httpx.Response(200, json=running),
        httpx.Response(200, json=done),
        httpx.Response(200, json={"version": 1}),
    )
    states: list[str] = []
    with AutoshardClient("http://autoshard", transport=transport) as client:
        plan = client.plan({"model": "mlp"}, progress=lambda job: states.append(job["state"]))
    assert plan == {"version": 1} and states == ["running", "succeeded"]
    assert seen[-1].url.path == f"/v1/plans/{JOB['problem_hash']}"


def test_a_failed_job_raises_its_error() -> None:
    failed = {**JOB, "state": "failed", "error": {"type": "infeasible", "message": "no plan fits"}}
    transport, _ = scripted(httpx.Response(200, json=failed))
    with (
        AutoshardClient("http://autoshard", transport=transport) as client,
        pytest.raises(ServiceError) as error,
    ):
        client.wait("j1")
    assert error.value.detail == "no plan fits" and error.value.job["state"] == "failed"
