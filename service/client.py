"""A Python client for launchers: submit a plan (or a bare solve), wait with progress, fetch the result.

    from service.client import AutoshardClient

    with AutoshardClient("http://autoshard:8000", token="...") as client:
        plan = client.plan({"model": "llama3-8b", "mesh": {"shape": [8, 8], "axis_names": ["dp", "tp"]}},
                           progress=lambda job: print(job["state"], job["progress"]))

Requests answered 429 (queue full: after its Retry-After) or 502/503/504, and connection errors, are tried
again up to ``retries`` times with a growing pause; any other error raises :class:`ServiceError` with the
service's message and the field it names.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

RETRY_STATUSES = (429, 502, 503, 504)
FINISHED = ("succeeded", "failed", "canceled")


class ServiceError(Exception):
    """The service refused a request or a job did not succeed."""

    def __init__(self, status: int | None, detail: str, field: str | None = None, job: dict | None = None):
        super().__init__(f"{status or 'job'}: {detail}")
        self.status = status
        self.detail = detail
        self.field = field
        self.job = job


class Submission:
    """What a submission got: the result at once (``result``), or a job to wait for (``job``)."""

    def __init__(self, result: dict[str, Any] | None, job: dict[str, Any] | None) -> None:
        self.result = result
        self.job = job

    @property
    def cached(self) -> bool:
        return self.result is not None


class AutoshardClient:
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s, transport=transport)
        self.retries = retries
        self.backoff_s = backoff_s

    def __enter__(self) -> AutoshardClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # ------------------------------------------------------------------------------------------ calls
    def submit_plan(self, request: dict[str, Any]) -> Submission:
        """POST /v1/plans: the stored plan (200) or the job working on it (202)."""
        return self._submission(self._request("POST", "/v1/plans", json=request))

    def submit_solve(self, problem: dict[str, Any], **options: Any) -> Submission:
        """POST /v1/solve with an IOPDDL document; ``options``: backend, time_limit_s, gap."""
        return self._submission(self._request("POST", "/v1/solve", json=problem, params=options))

    def job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}").json()

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/jobs/{job_id}").json()

    def fetch_plan(self, problem_hash: str) -> dict[str, Any]:
        """GET /v1/plans/{hash}: a stored plan (or bare-solve result)."""
        return self._request("GET", f"/v1/plans/{problem_hash}").json()

    def explain(self, problem_hash: str, target: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/plans/{problem_hash}/explain", params={"target": target}).json()

    def wait(
        self,
        job_id: str,
        progress: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Poll a job until it is finished; ``progress`` hears every state seen. Returns the finished job;
        raises ServiceError when it failed or was canceled, TimeoutError after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if progress is not None:
                progress(job)
            if job["state"] in FINISHED:
                if job["state"] != "succeeded":
                    error = job.get("error") or {"message": job["state"]}
                    raise ServiceError(None, error["message"], job=job)
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout_s} s")
            time.sleep(poll_s)

    def plan(
        self,
        request: dict[str, Any],
        progress: Callable[[dict[str, Any]], None] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Submit, wait and fetch: the plan JSON."""
        submission = self.submit_plan(request)
        if submission.result is not None:
            return submission.result
        assert submission.job is not None
        job = self.wait(submission.job["id"], progress, timeout_s=timeout_s)
        return self.fetch_plan(job["problem_hash"])

    def solve(
        self,
        problem: dict[str, Any],
        progress: Callable[[dict[str, Any]], None] | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """Submit a bare problem, wait and fetch: the solver's result JSON."""
        submission = self.submit_solve(problem, **options)
        if submission.result is not None:
            return submission.result
        assert submission.job is not None
        job = self.wait(submission.job["id"], progress)
        return self.fetch_plan(job["problem_hash"])

    # -------------------------------------------------------------------------------------- plumbing
    def _submission(self, response: httpx.Response) -> Submission:
        if response.status_code == 200:
            return Submission(response.json(), None)
        return Submission(None, response.json())

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self.http.request(method, url, **kwargs)
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, httpx.ConnectTimeout):
                if last:
                    raise
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(self._pause(response, attempt))
                continue
            if response.status_code >= 400:
                raise _error(response)
            return response
        raise AssertionError("unreachable")

    def _pause(self, response: httpx.Response, attempt: int) -> float:
        retry_after = response.headers.get("Retry-After", "")
        if retry_after.isdigit():
            return float(retry_after)
        return self.backoff_s * 2**attempt


def _error(response: httpx.Response) -> ServiceError:
    try:
        body = response.json()
        return ServiceError(response.status_code, str(body.get("detail")), body.get("field"))
    except ValueError:
        return ServiceError(response.status_code, response.text[:200])
