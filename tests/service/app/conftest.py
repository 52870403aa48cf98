"""A TestClient on an app without solver workers (jobs stay queued) and checks in a thread of its own
process: the API alone, fast."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app.main import create_app
from service.settings import Settings

MLP = {"model": "mlp", "mesh": {"shape": [4]}, "solver": {"time_limit_s": 5}}


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**settings: object) -> TestClient:
        values = {
            "database_url": f"sqlite:///{tmp_path / f'db{len(clients)}.sqlite'}",
            "workers": 0,
            "check_workers": 0,
            **settings,
        }
        client = TestClient(create_app(Settings(**values)), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()
