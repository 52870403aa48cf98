"""The explain processes seen from the routes: at most ``max_pending_explains`` requests at once (429
beyond), answers kept by (plan, target) since a stored plan never changes."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from fastapi import HTTPException, status

from service.app.errors import too_busy
from service.explaining import explain_or_error
from service.processes import PoolBusy, PoolFailed, ProcessPool, exit_with_server
from service.settings import Settings
from service.submissions import BadRequest

EXPLAIN_TIMEOUT_S = 120.0
KEPT_REPORTS = 512


class Explainer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pool = ProcessPool("explain", settings.explain_workers, settings.max_pending_explains, _start)
        self.reports: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()

    def close(self) -> None:
        self.pool.close()


async def explain(explainer: Explainer, problem_hash: str, document: str, target: str) -> dict[str, Any]:
    """The explain report of ``target`` in the stored plan ``document``; BadRequest for an unknown target."""
    key = (problem_hash, target)
    if key in explainer.reports:
        explainer.reports.move_to_end(key)
        return explainer.reports[key]
    try:
        report = await explainer.pool.run(EXPLAIN_TIMEOUT_S, explain_or_error, problem_hash, document, target)
    except PoolBusy as error:
        message = f"{explainer.settings.max_pending_explains} explain requests are under way; retry later"
        raise too_busy(message, explainer.settings.retry_after_s) from error
    except PoolFailed as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"explain failed: it {error}") from error
    if "unknown_target" in report:
        raise BadRequest("target", report["unknown_target"])
    if "bad_plan" in report:
        raise BadRequest("problem_hash", report["bad_plan"])
    explainer.reports[key] = report
    while len(explainer.reports) > KEPT_REPORTS:
        explainer.reports.popitem(last=False)
    return report


def _start(server: int) -> None:
    exit_with_server(server)
