"""A real ``autoshard serve`` process for end-to-end tests, started the way the service image starts it
(``autoshard serve`` configured by ``AUTOSHARD_*`` variables), on 127.0.0.1 and a free port."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.service.postgres import free_port

AUTOSHARD = Path(sys.executable).parent / "autoshard"
READY_TIMEOUT_S = 120.0


class ServerProcess:
    def __init__(
        self,
        database_url: str,
        log: Path,
        options: tuple[str, ...] = (),
        command: Path = AUTOSHARD,
        **settings: object,
    ) -> None:
        self.command = command
        """The ``autoshard`` executable (another install's, for the packaging test)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {
            **os.environ,
            "AUTOSHARD_HOST": "127.0.0.1",
            "AUTOSHARD_PORT": str(self.port),
            "AUTOSHARD_DATABASE_URL": database_url,
        }
        for key, value in settings.items():
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            self.env[f"AUTOSHARD_{key.upper()}"] = text
        self.options = options
        """``autoshard serve`` options (they override the environment)."""
        self.process: subprocess.Popen | None = None
        tokens = settings.get("tokens") or {}
        monitor = [token for token, scopes in tokens.items() if {"metrics", "admin"} & set(scopes)]  # type: ignore[union-attr]
        self.monitor_headers = {"Authorization": f"Bearer {monitor[0]}"} if monitor else {}
        """Headers of a token that may read /readyz's details (none needed without tokens)."""

    def start(self) -> ServerProcess:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(self.command), "serve"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self) -> ServerProcess:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.log_tail()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not get ready:\n{self.log_tail()}")

    def worker_pids(self) -> set[int]:
        """The solver worker processes, as /readyz reports them."""
        states = httpx.get(f"{self.url}/readyz", headers=self.monitor_headers, timeout=10).json()[
            "worker_processes"
        ]
        return {state["pid"] for state in states if state["pid"] is not None}

    def kill(self) -> None:
        """SIGKILL the server process alone, as a crash would (its workers must go by themselves)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL of whatever is left of its process group."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def session_processes(session: int) -> set[int]:
    """Live processes of a session (the server's: it is started as a session leader, and its children,
    workers, checkers, explain processes and multiprocessing's resource tracker, stay in its session)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            found.add(int(stat.parent.name))
    return found


def command_line(pid: int) -> str:
    """The process's command line ("" once it is gone): which child stayed, in a failure's message."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
