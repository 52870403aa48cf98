"""``GET /v1/plans/{hash}/explain``: why a stored plan placed a target as it did, computed in a process of
its own (it rebuilds the plan's problem: seconds of CPU that must not run in the event loop)."""

from __future__ import annotations

import copy
import math
from typing import Any


def explain_stored_plan(plan: dict[str, Any], target: str) -> dict[str, Any]:
    """The explain report of ``target`` in ``plan`` (as :func:`strategies.plan.explain.explain_plan_file`
    makes it from a file); hardware figures sent with the request are expanded first. Raises UnknownTarget."""
    from strategies.cost.hardware import override_hardware
    from strategies.plan.explain import check_target_in_plan, explain, rebuild, solution_from_plan
    from strategies.plan.plan_json import predict

    check_target_in_plan(plan, target)
    rebuilt_from = copy.deepcopy(plan)
    hardware = rebuilt_from["request"]["hardware"]
    if isinstance(hardware, dict):
        rebuilt_from["request"]["hardware"] = override_hardware(hardware)
    built, fallback = rebuild(rebuilt_from)
    chosen, unmapped = solution_from_plan(built, plan, fallback)
    report = explain(built, chosen, target)
    predicted = predict(built, chosen)["step_time_s"]
    recorded = plan.get("predicted", {}).get("step_time_s")
    report["plan"] = {
        "step_time_s": recorded,
        "mapped_step_time_s": predicted,
        "consistent": recorded is not None and math.isclose(predicted, recorded, rel_tol=1e-6, abs_tol=1e-12),
        "unmapped_nodes": unmapped,
    }
    return report


def explain_or_error(plan: dict[str, Any], target: str) -> dict[str, Any]:
    """:func:`explain_stored_plan` for a process pool: an unknown target comes back as
    ``{"unknown_target": message}`` (exceptions with extra fields do not pickle reliably)."""
    from strategies.plan.explain import UnknownTarget

    try:
        return explain_stored_plan(plan, target)
    except UnknownTarget as error:
        return {"unknown_target": str(error)}
