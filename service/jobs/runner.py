"""A replica's job runner: worker slots claim jobs from the store and run them in worker processes.

Each slot (a thread) owns one worker process. It claims the oldest queued job, hands it to its process and,
while the job runs, records progress, renews the job's lease every ``heartbeat_s`` and checks every
``poll_s`` that the job is still its own: a job canceled (``DELETE /v1/jobs/{id}``, from any replica) or
past its time limit has its process terminated and a fresh one started. A job that cannot be handed to its
worker, or whose worker dies under it, goes back to the queue until it has had ``max_attempts``, then fails
with the reason. A reaper thread does the same for running jobs whose lease expired (their replica died)
and applies the retention. Nothing here runs in the event loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from service.jobs.metrics import Metrics
from service.jobs.worker import worker_main
from service.processes import child_context
from service.settings import Settings
from service.store import jobs as job_store
from service.store import plans as plan_store
from service.store import searches as search_store
from service.store.models import FAILED, QUEUED, SEARCH, SUCCEEDED, Job
from service.store.plan_cache import PlanCache
from service.store.retention import apply_retention
from service.store.session import Store

log = logging.getLogger("autoshard.jobs")
READY_TIMEOUT_S = 120.0
TERMINATE_WAIT_S = 5.0


class WorkerProcess:
    """One worker process and the pipe to it; replaced whole when a job must be stopped."""

    def __init__(self) -> None:
        context = child_context()
        self.connection, child = context.Pipe()
        self.process: BaseProcess = context.Process(
            target=worker_main, args=(child, os.getpid()), daemon=True
        )
        self.process.start()
        child.close()
        self.ready = False

    def wait_ready(self, stop: threading.Event) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not stop.is_set() and time.monotonic() < deadline:
            if self.connection.poll(0.2):
                try:
                    self.ready = self.connection.recv() == ("ready",)
                except EOFError:
                    return False
                return self.ready
            if not self.process.is_alive():
                return False
        return False

    def terminate(self) -> None:
        """Stop the work now: SIGTERM, then SIGKILL if it lingers."""
        self.process.terminate()
        self.process.join(TERMINATE_WAIT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()


class WorkerSlot(threading.Thread):
    """Claims and runs jobs one at a time in its worker process."""

    def __init__(self, index: int, runner: JobRunner) -> None:
        super().__init__(name=f"worker-slot-{index}", daemon=True)
        self.runner = runner
        self.owner = f"{runner.replica}/{index}"
        self.worker: WorkerProcess | None = None

    @property
    def ready(self) -> bool:
        return self.worker is not None and self.worker.ready and self.worker.process.is_alive()

    def run(self) -> None:
        settings, stop = self.runner.settings, self.runner.stop
        while not stop.is_set():
            try:
                if not self.ready and not self._start_worker():
                    stop.wait(settings.poll_s)
                    continue
                with self.runner.store.session() as session:
                    job = job_store.claim_next_job(session, self.owner, settings.lease_s)
                if job is None:
                    stop.wait(settings.poll_s)
                    continue
                self._execute(job)
            except Exception:  # the store was unreachable: try again later
                log.exception("worker slot %s", self.owner)
                stop.wait(settings.poll_s)
        if self.worker is not None:
            self.worker.terminate()

    def _start_worker(self) -> bool:
        if self.worker is not None:
            self.worker.terminate()
        self.worker = WorkerProcess()
        return self.worker.wait_ready(self.runner.stop)

    def _execute(self, job: Job) -> None:
        """Run ``job`` in the worker process until it answers, is canceled, runs out of time or the
        replica stops; progress never delays those checks."""
        settings = self.runner.settings
        assert self.worker is not None
        log.info("job %s (%s %s) claimed by %s", job.id, job.kind, job.problem_hash[:12], self.owner)
        try:  # pickled whole before a byte is written: only an OSError leaves the pipe unusable
            self.worker.connection.send(("run", job.kind, *_work_request(job, settings)))
        except Exception as error:  # a broken pipe: retried, then failed
            log.warning("job %s could not be handed to its worker", job.id, exc_info=True)
            if isinstance(error, OSError):
                process = self.worker.process
                process.join(timeout=1.0)  # a pipe breaks when its worker dies: say so, as a death
                code = process.exitcode  # before this replica stops the worker itself
                self._stop_work()
                if code is not None:
                    self._retry_or_fail(job, f"its worker process died (exit code {code})")
                    return
            self._retry_or_fail(job, f"it could not be handed to a worker ({type(error).__name__})")
            return
        deadline = time.monotonic() + job.time_limit_s + settings.job_grace_s
        watch = _Watch(next_check=time.monotonic(), next_beat=time.monotonic())
        while True:
            message = self._receive(settings.poll_s)
            if message is not None and message[0] != "progress":
                self._finish(job, message, watch.progress)
                return
            if message is not None:
                watch.progress = message[1]
            if self.runner.stop.is_set():
                self._stop_work()
                with self.runner.store.session() as session:
                    job_store.release_jobs(session, self.owner)
                return
            if time.monotonic() >= deadline:
                self._time_out(job, watch.progress)
                return
            if not self._still_ours(job, watch):
                log.info("job %s is no longer %s's: stopping its worker", job.id, self.owner)
                self._stop_work()
                return

    def _still_ours(self, job: Job, watch: _Watch) -> bool:
        """Every ``poll_s``: is the job still this slot's (not canceled, not re-queued)? Every
        ``heartbeat_s`` the lease is renewed with the latest progress. A store error is logged and the
        job goes on (if the store stays away, the lease expires and the job is re-queued)."""
        settings, now = self.runner.settings, time.monotonic()
        if now < watch.next_check:
            return True
        beat = now >= watch.next_beat
        try:
            with self.runner.store.session() as session:
                if beat:
                    return job_store.renew_lease(
                        session, job.id, self.owner, settings.lease_s, watch.progress
                    )
                return _still_owned(session, job.id, self.owner)
        except Exception:
            log.exception("checking job %s", job.id)
            return True
        finally:
            watch.next_check = now + settings.poll_s
            if beat:
                watch.next_beat = now + settings.heartbeat_s

    def _time_out(self, job: Job, progress: dict[str, Any] | None) -> None:
        settings = self.runner.settings
        self._stop_work()
        limit = job.time_limit_s + settings.job_grace_s
        error = {"type": "timeout", "message": f"stopped after {limit:g} s"}
        with self.runner.store.session() as session:
            job_store.finish_job(session, job.id, self.owner, FAILED, error, progress)
        self.runner.metrics.jobs_finished.labels(FAILED).inc()

    def _receive(self, timeout: float) -> tuple | None:
        assert self.worker is not None
        try:
            if self.worker.connection.poll(timeout):
                return self.worker.connection.recv()
        except (EOFError, OSError):
            return ("died",)
        return None

    def _finish(self, job: Job, message: tuple, progress: dict[str, Any] | None) -> None:
        store, metrics = self.runner.store, self.runner.metrics
        if message[0] == "died":
            self._stop_work()
            code = None if self.worker is None else self.worker.process.exitcode
            self._retry_or_fail(job, f"its worker process died (exit code {code})")
            return
        if message[0] == "done":
            _, document, seconds = message  # the result's JSON text, stored as it came
            with store.session() as session:
                if job.kind == SEARCH:
                    search_store.save_results(session, job.id, job.problem_hash, document, seconds)
                else:
                    plan_store.save_plan(
                        session, job.problem_hash, job.kind, document, job.id, seconds, job.owner
                    )
                job_store.finish_job(session, job.id, self.owner, SUCCEEDED, None, progress)
            metrics.solve_seconds.labels(job.kind).observe(seconds)
            metrics.jobs_finished.labels(SUCCEEDED).inc()
            log.info("job %s succeeded in %.2f s", job.id, seconds)
        else:
            with store.session() as session:
                job_store.finish_job(session, job.id, self.owner, FAILED, message[1], progress)
            metrics.jobs_finished.labels(FAILED).inc()
            log.info("job %s failed: %s", job.id, message[1]["message"])
            if self.worker is not None and not self.worker.process.is_alive():
                self.worker.ready = False

    def _retry_or_fail(self, job: Job, reason: str) -> None:
        settings = self.runner.settings
        with self.runner.store.session() as session:
            state = job_store.retry_or_fail(session, job.id, self.owner, reason, settings.max_attempts)
        log.warning("job %s: %s; %s", job.id, reason, "re-queued" if state == QUEUED else state)
        if state == FAILED:
            self.runner.metrics.jobs_finished.labels(FAILED).inc()

    def _stop_work(self) -> None:
        assert self.worker is not None
        self.worker.terminate()
        self.worker.ready = False


def _work_request(job: Job, settings: Settings) -> tuple[str, dict[str, Any] | None]:
    """What the worker runs: the stored request as its JSON text (parsed in the worker: a multi-MiB graph
    is never parsed or pickled whole in the API process); a search's context also names its output folder,
    the plan cache it shares with the service (its database: passed over the pipe, never stored with the
    job) and its owner."""
    if job.kind != SEARCH:
        return job.request, None
    out = Path(settings.search_dir) / job.id
    return job.request, {"out": str(out), "cache_url": settings.database_url, "owner": job.owner}


@dataclass
class _Watch:
    next_check: float
    next_beat: float
    progress: dict[str, Any] | None = None


def _still_owned(session: Any, job_id: str, owner: str) -> bool:
    job = job_store.get_job(session, job_id)
    return job is not None and job.state == "running" and job.lease_owner == owner


class JobRunner:
    """The worker slots and the lease reaper of one replica."""

    def __init__(
        self, settings: Settings, store: Store, metrics: Metrics, cache: PlanCache | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.cache = cache
        self.replica = settings.replica or f"{socket.gethostname()}:{os.getpid()}"
        self.stop = threading.Event()
        self.slots = [WorkerSlot(i, self) for i in range(settings.workers)]
        self.reaper = threading.Thread(target=self._reap, name="lease-reaper", daemon=True)

    def start(self) -> None:
        self.reaper.start()
        for slot in self.slots:
            slot.start()

    def shutdown(self) -> None:
        """Stop every worker; jobs running here go back to the queue for the next replica."""
        self.stop.set()
        for slot in self.slots:
            slot.join(TERMINATE_WAIT_S * 2)
        self.reaper.join(TERMINATE_WAIT_S)

    @property
    def ready_workers(self) -> int:
        return sum(slot.ready for slot in self.slots)

    def worker_states(self) -> list[dict[str, object]]:
        """Per slot: its worker process id (None before the first start) and whether it is ready."""
        return [
            {
                "slot": slot.owner,
                "pid": None if slot.worker is None else slot.worker.process.pid,
                "ready": slot.ready,
            }
            for slot in self.slots
        ]

    def _reap(self) -> None:
        settings = self.settings
        next_retention = time.monotonic()
        while not self.stop.is_set():
            try:
                with self.store.session() as session:
                    requeued, failed = job_store.expire_leases(session, settings.max_attempts)
                if requeued or failed:
                    log.warning(
                        "leases expired: %d job(s) re-queued, %d failed (attempts used)", requeued, failed
                    )
                if settings.retention_days > 0 and time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + settings.retention_every_s
                    self.apply_retention()
            except Exception:
                log.exception("lease reaper")
            self.stop.wait(min(settings.heartbeat_s, settings.lease_s / 2))

    def apply_retention(self) -> None:
        """Delete what is older than the retention; the memory cache forgets the deleted results."""
        purged = apply_retention(self.store, self.settings.retention_days, Path(self.settings.search_dir))
        if self.cache is not None:
            self.cache.discard(purged.results)
