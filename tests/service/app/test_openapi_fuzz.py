"""A bounded schemathesis run against the OpenAPI spec (over 1,000 generated requests, valid and invalid
by the schema, on every operation): no answer is a 5xx. Then the submissions' generated bodies with an
unknown field added, or a number made non-finite (``NaN``, ``Infinity``, ``1e400``: not JSON, but parsers
take them): every one is refused with a 4xx."""

from __future__ import annotations

import json
import random

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

EXAMPLES_PER_OPERATION = 45  # ~1,250 requests in all (60: ~1,700 and 50 s of the suite, mostly generating)
MIN_REQUESTS = 1000
MUTATED_PER_OPERATION = 40
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e400")
SUBMISSIONS = ("/v1/plans", "/v1/searches", "/v1/solve")


def bounded(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def test_generated_requests_never_get_a_5xx(make_client) -> None:
    client: TestClient = make_client(tokens={})
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    answered: list[int] = []
    server_errors: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @bounded(EXAMPLES_PER_OPERATION)
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


def _objects(value: object) -> list[dict]:
    """Every JSON object within ``value``, outermost first."""
    found, stack = [], [value]
    while stack:
        item = stack.pop(0)
        if isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _numbers(value: object, path: tuple = ()) -> list[tuple]:
    """Paths of the numbers (not booleans) within ``value``."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _numbers(item, (*path, key))]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _numbers(item, (*path, i))]
    return [path] if isinstance(value, int | float) and not isinstance(value, bool) else []


def _with_unknown_field(body: dict, rng: random.Random) -> bytes:
    target = rng.choice(_objects(body)[:8])
    target["zz_not_a_field"] = rng.choice([1, "x", None, [1], {"a": 1}])
    return json.dumps(body).encode()


def _with_non_finite(body: dict, rng: random.Random) -> bytes | None:
    paths = _numbers(body)
    if not paths:
        return None
    path = rng.choice(paths)
    container = body
    for key in path[:-1]:
        container = container[key]
    container[path[-1]] = "__NON_FINITE__"
    return json.dumps(body).replace('"__NON_FINITE__"', rng.choice(NON_FINITE)).encode()


def test_unknown_fields_and_non_finite_numbers_are_always_refused(make_client) -> None:
    client: TestClient = make_client(tokens={})
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    answers: list[tuple[str, int, str]] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() != "POST" or operation.path not in SUBMISSIONS:
            continue

        @bounded(MUTATED_PER_OPERATION)
        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        def call(case: schemathesis.Case) -> None:
            if not isinstance(case.body, dict):
                return
            rng = random.Random(json.dumps(case.body, sort_keys=True, default=str))
            for mutate in (_with_unknown_field, _with_non_finite):
                body = mutate(json.loads(json.dumps(case.body)), rng)
                if body is None:
                    continue
                response = client.post(
                    case.path,
                    content=body,
                    params=case.query or {},
                    headers={"content-type": "application/json"},
                )
                answers.append((f"{case.path} {mutate.__name__}", response.status_code, body[:300].decode()))

        call()
    wrong = [answer for answer in answers if not 400 <= answer[1] < 500]
    print(f"mutated submissions: {len(answers)}, statuses {sorted({status for _, status, _ in answers})}")
    assert not wrong, wrong[:5]
    assert len(answers) >= 150, len(answers)
