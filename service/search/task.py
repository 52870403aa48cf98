"""One candidate planned in a worker: from the model configuration's graph document captured once by the
search, loaded once per worker process and kept; the result is what the runner records."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strategies.graph.imported import ImportedGraph
    from strategies.plan.request import PlanOutcome, PlanRequest

OPTIMAL, FEASIBLE, INFEASIBLE, PRUNED, FAILED = "optimal", "feasible", "infeasible", "pruned", "failed"
SKIPPED = "skipped"
"""Not planned: the search's budget was spent before it could start, or ended while it was planning."""
STATUSES = (OPTIMAL, FEASIBLE, INFEASIBLE, PRUNED, FAILED, SKIPPED)
UNPLANNED = (INFEASIBLE, PRUNED, FAILED, SKIPPED)
"""The statuses of a row without a plan, counted apart by the progress the CLI and the service show."""

_loaded: dict[str, ImportedGraph] = {}
"""Graph documents this process has read, by digest: each is read once however many meshes use it."""
MAX_LOADED = 8


@dataclass
class CandidateTask:
    """What a worker needs for one candidate: its plan request (naming the model, for the plan's record)
    and the digest of the graph document to plan it from."""

    candidate_id: str
    request: PlanRequest
    graph_digest: str
    threads: int = 1
    """Cores its solve may use: the executor's cores per task (a pool of two on two cores: one each; two
    would fork a second heuristic per solve onto a core the other worker needs)."""
    microbatch_digests: dict[int, str] = field(default_factory=dict)
    """A pipeline's candidate: the digest of the document captured at each micro-batch size (its graph is
    then those documents by size)."""


def plan_candidate(task: CandidateTask, graph: dict[str, Any]) -> dict[str, Any]:
    """Plan one candidate from ``graph`` (its configuration's document): ``{"id", "status", "plan",
    "min_peak_bytes", "bound_s", "error", "seconds"}``. A budget no plan fits is ``infeasible`` with the
    smallest peak any plan reaches; a request whose cutoff no plan beats is ``pruned`` with the bound that
    proves it; any other error is ``failed`` with its reason. Never raises."""
    from solver.errors import InfeasibleError
    from strategies.plan.planner import PrunedError, plan_captured

    started = time.perf_counter()
    outcome: dict[str, Any] = {"id": task.candidate_id, "plan": None, "min_peak_bytes": None, "error": None}
    try:
        if task.microbatch_digests:
            plan = _pipeline(task, graph)
        else:
            imported = _graph(task.graph_digest, graph)
            plan = plan_captured(task.request, imported.graph, imported.repeat, threads=task.threads).plan
        outcome.update(status=plan["solver"]["status"], plan=plan)
    except InfeasibleError as error:
        outcome.update(status=INFEASIBLE, min_peak_bytes=error.min_peak, error=str(error))
    except PrunedError as error:
        outcome.update(status=PRUNED, bound_s=error.bound_s, error=str(error))
    except Exception as error:  # reported with the candidate: the search goes on
        from service.planning import public_message

        outcome.update(status=FAILED, error=public_message(error))
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def _pipeline(task: CandidateTask, documents: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A pipeline candidate's plan: each micro-batch plan from the document captured at its size."""
    from strategies.cost.mesh import make_mesh
    from strategies.plan.pipeline_plan import plan_pipeline
    from strategies.plan.planner import plan_captured

    def plan_microbatch(request: PlanRequest, say: Callable[[str], None]) -> PlanOutcome:
        size = int(request.batch or 0)
        imported = _graph(task.microbatch_digests[size], documents[size])
        return plan_captured(request, imported.graph, imported.repeat, say, threads=task.threads)

    request = task.request
    mesh = make_mesh(request.mesh, request.axis_names, request.hardware)
    return plan_pipeline(request, mesh, lambda message: None, plan_microbatch).plan


def warm_up_worker() -> None:
    """Load every compiled kernel a candidate runs (numba's cache: ~1 s in a new process) before the first
    candidate comes: a pool's workers do it while the search captures its first configuration."""
    import numpy as np

    from solver.solve import warm_up_kernels
    from strategies.cost.comm import redistribute_matrix
    from strategies.cost.mesh import make_mesh
    from strategies.placement import P, R

    warm_up_kernels()
    specs = np.array([[R, R], [0, R], [R, 1], [P, R]], dtype=np.int16)
    redistribute_matrix(make_mesh("2x2"), (4, 4), 2, specs, specs)


def _graph(digest: str, document: dict[str, Any]) -> ImportedGraph:
    from strategies.graph.imported import load_graph

    found = _loaded.get(digest)
    if found is None:
        if len(_loaded) >= MAX_LOADED:
            _loaded.pop(next(iter(_loaded)))
        found = _loaded[digest] = load_graph(document)
    return found
