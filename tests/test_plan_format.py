"""docs/plan-format.md and the planner agree: every field the page lists as always there is in real plans,
every field the planner writes is on the page, the request's fields are PlanRequest's, and the page's
example is JSON of that shape."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from strategies.plan.planner import PlanRequest, plan_model

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "plan-format.md").read_text(encoding="utf-8")
# a short capture's plan; a plan of smaller peak within the gap; a pipeline's plan
ONLY_SOMETIMES = {"layers", "fastest", "pipeline", "bubble_s"}
LLAMA = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "ffn_dim": 128, "max_seq_len": 64}


def table_fields(heading: str) -> set[str]:
    """The first column of the table under ``heading`` (its backticked names)."""
    section = PAGE.split(heading, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))


@pytest.fixture(scope="module")
def plans() -> list[dict]:
    return [
        plan_model(PlanRequest(model="mlp", mesh="2", time_limit=5)).plan,
        plan_model(
            PlanRequest(model="llama3-8b", mesh="2", batch=2, seq=16, layers=6, options=LLAMA, time_limit=5)
        ).plan,
    ]


def test_the_pages_fields_are_the_planners(plans) -> None:
    top, predicted = table_fields("## Top level"), table_fields("## `predicted`")
    assert {"version", "nodes", "recompute", "request"} <= top and {
        "step_time_s",
        "memory_profile",
    } <= predicted
    for plan in plans:
        assert set(plan) <= top and top - ONLY_SOMETIMES <= set(plan)
        assert set(plan["predicted"]) <= predicted and predicted - ONLY_SOMETIMES <= set(plan["predicted"])
    assert plans[1]["layers"] == {"captured": 4, "total": 6}


def test_the_request_fields_listed_are_plan_requests() -> None:
    row = next(line for line in PAGE.splitlines() if line.startswith("| `request` |"))
    listed = set(re.findall(r"`([a-z_]+)`", row.split("every field of `autoshard plan`", 1)[1].split(";")[0]))
    assert listed == {field.name for field in dataclasses.fields(PlanRequest)}


def test_the_pages_example_is_a_plan_of_that_shape(plans) -> None:
    (example,) = re.findall(r"```json\n(.*?)```", PAGE, flags=re.DOTALL)
    document = json.loads(example)
    assert set(document) == set(plans[0]) and set(document["predicted"]) == set(plans[0]["predicted"])
    assert set(document["solver"]) == set(plans[0]["solver"]) and document["version"] == plans[0]["version"]
