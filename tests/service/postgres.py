"""A throwaway PostgreSQL server for the tests: initdb and pg_ctl on a temporary folder, a free port on
127.0.0.1, trust authentication. As root (CI) the server runs as the ``postgres`` user, since PostgreSQL
refuses to run as root. The binaries come from the system (``make test`` installs Debian's ``postgresql``
when they are missing); without them the tests fail with a message saying so, they are not skipped."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

MISSING = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH nor in /usr/lib/postgresql/*/bin: "
    "run `make postgres` (as root it installs the Debian package postgresql) or install them"
)


def find_binaries() -> Path:
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    raise RuntimeError(MISSING)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PostgresServer:
    """One server; :meth:`new_database` gives each test module a database of its own."""

    USER = "autoshard"

    def __init__(self) -> None:
        self.bin = find_binaries()
        self.folder = Path(tempfile.mkdtemp(prefix="autoshard-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.run_as = "postgres" if os.geteuid() == 0 else None
        self._count = 0

    def _run(self, *command: str) -> None:
        result = subprocess.run(command, user=self.run_as, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stdout}{result.stderr}")

    def start(self) -> PostgresServer:
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", self.USER, "--auth=trust", "-E", "UTF8"
        )
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.folder / "log"),
            "-w",
            "start",
        )
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        self._count += 1
        name = f"autoshard_test_{self._count}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={self.USER} dbname=postgres", autocommit=True
        ) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
