"""``GET /v1/plans/{hash}/explain``: why a stored plan placed a target as it did, computed in a process of
its own (it rebuilds the plan's problem: seconds of CPU that must not run in the event loop)."""

from __future__ import annotations

from typing import Any


def explain_or_error(plan: dict[str, Any], target: str) -> dict[str, Any]:
    """:func:`strategies.plan.explain.explain_plan` for a process pool: an unknown target comes back as
    ``{"unknown_target": message}`` (exceptions with extra fields do not pickle reliably)."""
    from strategies.plan.explain import UnknownTarget, explain_plan

    try:
        return explain_plan(plan, target)
    except UnknownTarget as error:
        return {"unknown_target": str(error)}
