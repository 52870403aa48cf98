"""Service benchmark: a real `autoshard serve` on loopback, measured from a client on the same machine.

    python benchmarks/service.py [--seconds 30] [--rate 200] [--jobs 8] [--workers 2] [--database-url URL]
                                 [--json]

Rows (issue 14, part 6):
- "submit -> plan (mlp, cold)": wall time of the client's submit, poll and fetch of an `mlp` plan on a mesh
  of 4 that was never solved (a worker process already warm).
- "cached plans, open loop": `--rate` requests per second for `--seconds` of `POST /v1/plans` whose plan is
  stored (200 from the cache), sent on schedule whatever the answers' pace (at most 256 in flight); the
  requests/s served, latency p50 / p99 / max from each request's scheduled send to its whole answer, and
  errors by kind.
- "jobs per minute (mlp, distinct)": `--jobs` distinct small plans (`mlp`, mesh 4, batches 16, 24, ...)
  submitted at once to `--workers` worker processes; finished jobs per minute of wall time.
- "cached plans while a large graph is checked" (issue 23): the same open loop while a launcher's graph of
  `--graph-mib` MiB (a small-width Llama captured with every layer, exported once) is submitted; its check
  runs in a checker process. Latency p50 / p99 / max of the cached requests sent while it was being checked,
  and how long the graph's submission took to be answered.
The server keeps its own SQLite file in a temporary folder unless --database-url is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.client import AutoshardClient  # noqa: E402

MLP = {"model": "mlp", "mesh": {"shape": [4]}, "solver": {"time_limit_s": 10}}
MAX_IN_FLIGHT = 256


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(database_url: str, workers: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "AUTOSHARD_HOST": "127.0.0.1",
        "AUTOSHARD_PORT": str(port),
        "AUTOSHARD_DATABASE_URL": database_url,
        "AUTOSHARD_WORKERS": str(workers),
        "AUTOSHARD_POLL_S": "0.1",
        "AUTOSHARD_MAX_LIVE_JOBS": "1000",
    }
    command = [str(Path(sys.executable).parent / "autoshard"), "serve", "--log-level", "warning"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            ready = httpx.get(f"{url}/readyz", timeout=2).json()
            if ready.get("status") == "ready" and ready.get("workers_ready") == workers:
                return process, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server did not get ready; its log:\n{log.read_text()[-3000:]}")


def cold_plan_seconds(url: str) -> float:
    with AutoshardClient(url) as client:
        started = time.perf_counter()
        client.plan(MLP, timeout_s=300)
        return time.perf_counter() - started


class KeepAliveClient:
    """HTTP/1.1 POSTs of one prepared request over reused loopback connections (asyncio streams).

    The load generator shares the server's two cores: httpx's AsyncClient spent about 5 ms of CPU a request
    (one core at 100% for 200 requests/s, 2026-12-03), so the latencies measured the generator more than
    the server. Here a request is one write of prepared bytes and a read of the status line, the headers and
    ``Content-Length`` bytes of body."""

    def __init__(self, url: str, path: str, body: bytes) -> None:
        host, port = httpx.URL(url).host, httpx.URL(url).port
        assert port is not None
        self.address = (host, port)
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self) -> int:
        """The answer's status code (the body is read and dropped); the connection is kept for the next."""
        while self.idle:
            reader, writer = self.idle.pop()
            try:
                return await self._exchange(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()  # closed by the server while idle (its keep-alive timeout): the next one
        return await self._exchange(*await asyncio.open_connection(*self.address))

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(self.request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        await reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection") == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return status

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def open_loop(
    url: str, seconds: float, rate: float, graph: bytes | None = None, graph_at_s: float = 1.0
) -> dict[str, Any]:
    """``rate`` cached submissions per second for ``seconds``, each sent at its scheduled time; with
    ``graph``, that plan submission is sent ``graph_at_s`` into the load, and the figures are those of the
    cached requests sent while it was answered."""
    latencies: list[float] = []
    sent_at: list[float] = []
    errors = 0
    failures: dict[str, int] = {}
    graph_window: list[float] = []
    gate = asyncio.Semaphore(MAX_IN_FLIGHT)
    cached = KeepAliveClient(url, "/v1/plans", json.dumps(MLP).encode())

    async def one(scheduled: float) -> None:
        nonlocal errors
        async with gate:
            try:
                status = await cached.post()
                failure = None if status == 200 else f"HTTP {status}"
            except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                failure = type(error).__name__
            ok = failure is None
            if failure is not None:
                failures[failure] = failures.get(failure, 0) + 1
            # from the scheduled send: a request the generator or the gate held back counts its wait
            latencies.append(time.perf_counter() - scheduled)
            sent_at.append(scheduled)
            errors += not ok

    async def submit_graph() -> None:
        assert graph is not None
        await asyncio.sleep(graph_at_s)
        sent = time.perf_counter()
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            response = await client.post(
                "/v1/plans", content=graph, headers={"content-type": "application/json"}
            )
        graph_window.extend((sent, time.perf_counter()))
        if response.status_code not in (200, 202):
            raise SystemExit(f"the graph was refused: {response.status_code} {response.text[:500]}")

    tasks = [asyncio.create_task(submit_graph())] if graph is not None else []
    started = time.perf_counter()
    count = int(seconds * rate)
    try:
        for i in range(count):
            scheduled = started + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(scheduled)))
        await asyncio.gather(*tasks)
    finally:
        cached.close()
    elapsed = time.perf_counter() - started
    extra: dict[str, Any] = {}
    if graph is not None:
        begin, end = graph_window
        latencies = [
            latency for latency, sent in zip(latencies, sent_at, strict=True) if begin <= sent <= end
        ]
        extra = {"graph_answer_s": end - begin, "graph_bytes": len(graph)}
        elapsed = end - begin
    ordered = sorted(latencies)
    return {
        **extra,
        "requests": len(ordered),
        "seconds": elapsed,
        "requests_per_s": len(ordered) / elapsed,
        "p50_ms": 1e3 * statistics.median(ordered),
        "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max_ms": 1e3 * ordered[-1],
        "errors": errors,
        "failures": failures,
    }


def errors_text(figures: dict[str, Any]) -> str:
    kinds = ", ".join(f"{kind}: {count}" for kind, count in sorted(figures["failures"].items()))
    return f"{figures['errors']} errors" + (f" ({kinds})" if kinds else "")


def jobs_per_minute(url: str, jobs: int) -> dict[str, Any]:
    with AutoshardClient(url) as client:
        started = time.perf_counter()
        submitted = [client.submit_plan({**MLP, "batch": 16 + 8 * i}).job for i in range(jobs)]
        for job in submitted:
            client.wait(job["id"], poll_s=0.1, timeout_s=600)
        elapsed = time.perf_counter() - started
    return {"jobs": jobs, "seconds": elapsed, "jobs_per_minute": 60 * jobs / elapsed}


def graph_body(mib: float, folder: Path) -> bytes:
    """A plan submission with a launcher's graph of about ``mib`` MiB: a Llama of small width captured with
    every layer (about 48 KB a layer), exported in this process."""
    from strategies.graph.export import graph_json
    from strategies.plan.planner import PlanRequest, export_request_graph

    small = {"dim": 256, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "ffn_dim": 768}
    layers = max(1, round(mib * 2**20 / 48_400))
    request = PlanRequest(
        model="llama3-8b", mesh="2", layers=layers, batch=2, seq=16, options=small, captured_layers=None
    )
    document = json.loads(graph_json(export_request_graph(request)))
    body = json.dumps({"graph": document, "mesh": {"shape": [2]}, "solver": {"time_limit_s": 10}}).encode()
    (folder / "graph-submission.json").write_bytes(body)
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the cached-plan load")
    parser.add_argument("--rate", type=float, default=200.0, help="cached-plan requests per second")
    parser.add_argument("--jobs", type=int, default=8, help="distinct small plans for jobs per minute")
    parser.add_argument("--workers", type=int, default=2, help="the server's worker processes")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary folder")
    parser.add_argument(
        "--graph-mib", type=float, default=3.3, help="the large graph's size (0: no such row)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autoshard-bench-") as folder:
        graph = graph_body(args.graph_mib, Path(folder)) if args.graph_mib > 0 else None
        url_db = args.database_url or f"sqlite:///{Path(folder) / 'autoshard.db'}"
        process, url = start_server(url_db, args.workers, Path(folder) / "server.log")
        try:
            cold = cold_plan_seconds(url)
            load = asyncio.run(open_loop(url, args.seconds, args.rate))
            checked = None
            if graph is not None:
                checked = asyncio.run(open_loop(url, args.seconds, args.rate, graph=graph))
            throughput = jobs_per_minute(url, args.jobs)
        finally:
            process.terminate()
            process.wait(30)
    if args.json:
        figures = {"cold_plan_s": cold, "cached": load, "while_checking": checked, "jobs": throughput}
        print(json.dumps(figures, indent=1))
        return
    print(f"| measure | figure |\n|---|---|\n| submit -> plan (mlp, mesh 4, cold) | {cold:.2f} s |")
    print(
        f"| cached plans, open loop at {args.rate:g}/s for {args.seconds:g} s | "
        f"{load['requests_per_s']:.1f} requests/s served, p50 {load['p50_ms']:.1f} ms, "
        f"p99 {load['p99_ms']:.1f} ms, max {load['max_ms']:.1f} ms, {errors_text(load)} "
        f"of {load['requests']} |"
    )
    if checked is not None:
        print(
            f"| cached plans at {args.rate:g}/s while a {checked['graph_bytes'] / 2**20:.1f} MiB graph is "
            f"checked | {checked['requests']} requests in its {checked['graph_answer_s']:.1f} s: p50 "
            f"{checked['p50_ms']:.1f} ms, p99 {checked['p99_ms']:.1f} ms, max {checked['max_ms']:.1f} ms, "
            f"{errors_text(checked)} in the whole load |"
        )
    print(
        f"| jobs per minute (mlp, {throughput['jobs']} distinct, {args.workers} workers) | "
        f"{throughput['jobs_per_minute']:.1f} ({throughput['seconds']:.1f} s) |"
    )


if __name__ == "__main__":
    main()
