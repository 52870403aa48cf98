"""``GET /v1/plans/{hash}/explain``: why a stored plan placed a target as it did, computed in an explain
process (it rebuilds the plan's problem: seconds of CPU that must not run in the event loop). Each process
keeps the problems it rebuilt for the last few plans, so the next target of the same plan takes
milliseconds."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

REBUILT_PLANS = 4
"""Rebuilt problems an explain process keeps (a llama3-8b problem: tens of MB)."""
_rebuilt: OrderedDict[str, Any] = OrderedDict()


def explain_or_error(problem_hash: str, document: str, target: str) -> dict[str, Any]:
    """:func:`strategies.plan.explain.explain_rebuilt` for a process pool: an unknown target comes back as
    ``{"unknown_target": message}``, a plan the service cannot rebuild as ``{"bad_plan": message}``
    (exceptions with extra fields do not pickle reliably)."""
    from strategies.cost.hardware import PRESETS
    from strategies.plan.explain import UnknownTarget, check_target_in_plan, explain_rebuilt, rebuild_plan

    plan = json.loads(document)
    hardware = plan.get("request", {}).get("hardware")
    if isinstance(hardware, str) and hardware not in PRESETS:  # never a file named by a stored plan
        return {"bad_plan": "its hardware is neither a preset nor figures"}
    try:
        check_target_in_plan(plan, target)
        rebuilt = _rebuilt.get(problem_hash)
        if rebuilt is None:
            rebuilt = _rebuilt[problem_hash] = rebuild_plan(plan)
            while len(_rebuilt) > REBUILT_PLANS:
                _rebuilt.popitem(last=False)
        _rebuilt.move_to_end(problem_hash)
        return explain_rebuilt(plan, rebuilt, target)
    except UnknownTarget as error:
        return {"unknown_target": str(error)}
