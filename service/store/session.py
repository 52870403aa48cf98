"""Engines and sessions: SQLite (one file, WAL, waits on locks) or PostgreSQL, by URL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_JOURNAL_LIMIT_BYTES = 64 * 2**20
"""The write-ahead log is cut back to this size after each checkpoint (it otherwise keeps its largest
size: a few large writes once left a 243 MiB log)."""


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL (readers do not wait on the writer) and a busy timeout."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA journal_size_limit={SQLITE_JOURNAL_LIMIT_BYTES}")
    cursor.close()


def is_postgresql(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


class Store:
    """The database of one process: its engine and a session factory."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session committed when the block ends without error, rolled back otherwise."""
        with self._sessions() as session, session.begin():
            yield session

    def new_session(self) -> Session:
        """A plain session: the caller commits."""
        return self._sessions()

    def dispose(self) -> None:
        self.engine.dispose()
