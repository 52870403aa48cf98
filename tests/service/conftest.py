"""Fixtures of the service's tests: a database URL for each store (SQLite and a real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.stop()


def new_database_url(kind: str, folder: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{folder / 'autoshard.db'}"
    return request.getfixturevalue("postgres_server").new_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    return new_database_url(request.param, tmp_path, request)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh database of each kind shared by one module's tests."""
    return new_database_url(request.param, tmp_path_factory.mktemp("db"), request)
