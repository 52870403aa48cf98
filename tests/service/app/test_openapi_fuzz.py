"""A bounded schemathesis run against the OpenAPI spec (over 1,000 generated requests, valid and invalid
by the schema, on every operation): no answer is a 5xx."""

from __future__ import annotations

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

EXAMPLES_PER_OPERATION = 80
MIN_REQUESTS = 1000


def test_generated_requests_never_get_a_5xx(make_client) -> None:
    client: TestClient = make_client(tokens={})
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    answered: list[int] = []
    server_errors: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case: schemathesis.Case) -> None:
                response = case.call()
                answered.append(response.status_code)
                if response.status_code >= 500:
                    server_errors.append(f"{case.method} {case.formatted_path}: {response.status_code}")

            try:
                call()
            except Unsatisfiable:  # an operation without parameters has no invalid request to make
                assert mode is GenerationMode.NEGATIVE
    print(f"schemathesis: {len(answered)} requests, statuses {sorted(set(answered))}")
    assert not server_errors, server_errors[:5]
    assert len(answered) >= MIN_REQUESTS, len(answered)
