"""The service's plan cache seen from a search: a candidate is the ``POST /v1/plans`` request of its mesh
and batch, keyed by the service's :func:`~service.planning.plan_hash`; a plan stored under that key (by the
service or an earlier search) and readable by the search's principal is reused, and a new one is stored for
both (readable by that principal: the job's owner for a service search, ``anonymous`` from the CLI, as for
a service without tokens). A search whose request the service could not take (hardware from a file) plans
without the cache."""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import ValidationError

from service.access import ANONYMOUS
from service.search.candidates import Candidate
from service.search.request import SearchRequest


class SearchPlanCache:
    """The plans table of the service database at ``url`` (migrated to the newest schema first)."""

    def __init__(self, url: str, reader: str = ANONYMOUS) -> None:
        from service.store.migrate import upgrade_to_head
        from service.store.session import Store

        upgrade_to_head(url)
        self.store = Store(url)
        self.reader = reader
        self.search_id = str(uuid.uuid4())
        """Recorded as the job of the plans this search stores."""

    def key(self, request: SearchRequest, candidate: Candidate) -> str | None:
        """The service's key of the candidate's plan; None when the service could not take its request."""
        from service.planning import plan_hash
        from service.submissions import PlanSubmission, canonical_plan_request

        try:
            submission = PlanSubmission.model_validate(request.service_submission(candidate))
        except ValidationError:
            return None
        return plan_hash(canonical_plan_request(submission))

    def get(self, key: str | None) -> dict[str, Any] | None:
        from service.store.plans import get_plan

        if key is None:
            return None
        with self.store.session() as session:
            stored = get_plan(session, key, self.reader)
            return None if stored is None or stored.kind != "plan" else json.loads(stored.document)

    def put(self, key: str | None, plan: dict[str, Any], seconds: float) -> None:
        from service.store.plans import save_plan

        if key is None:
            return
        with self.store.session() as session:
            save_plan(session, key, "plan", plan, self.search_id, seconds, self.reader)

    def close(self) -> None:
        self.store.dispose()
