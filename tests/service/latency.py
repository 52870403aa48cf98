"""``/healthz`` latency seen from a process of its own (the test process's own work never delays it): a
poller sends one request every POLL_S on a kept-alive connection and records when it was sent and how long
the answer took."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

POLL_S = 0.02
POLLER = r"""
import http.client, sys, time
host, port, out = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "a", buffering=1)
connection = http.client.HTTPConnection(host, port, timeout=10)
while True:
    sent = time.time()
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        response.read()
        ok = response.status == 200
    except Exception:
        connection.close()
        connection = http.client.HTTPConnection(host, port, timeout=10)
        ok = False
    out.write(f"{sent} {time.time() - sent if ok else float('inf')}\n")
    time.sleep(%(poll)s)
"""


@dataclass
class Window:
    """The samples taken between the window's start and end."""

    samples: list[float] = field(default_factory=list)

    @property
    def worst_s(self) -> float:
        return max(self.samples)


class HealthWatch:
    def __init__(self, port: int, folder: Path) -> None:
        self.log = folder / "healthz.log"
        self.log.touch()
        script = POLLER % {"poll": POLL_S}
        self.process = subprocess.Popen([sys.executable, "-c", script, "127.0.0.1", str(port), str(self.log)])

    @contextmanager
    def window(self, min_samples: int = 5) -> Iterator[Window]:
        """Samples sent while the block ran, the window held open after it until ``min_samples`` were
        taken (a quick block is watched for ``min_samples * POLL_S`` at least)."""
        window = Window()
        started = time.time()
        yield window
        deadline = time.monotonic() + 10
        while len(samples := self._samples(started, time.time())) < min_samples:
            assert time.monotonic() < deadline, f"the health poller took {len(samples)} samples"
            time.sleep(POLL_S)
        window.samples.extend(samples)

    def _samples(self, start: float, end: float) -> list[float]:
        rows = (line.split() for line in self.log.read_text().splitlines() if line.strip())
        return [float(seconds) for sent, seconds in rows if start <= float(sent) <= end]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
