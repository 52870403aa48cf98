"""Run a search: candidates, one capture per model configuration, cached plans, an executor, the results.

The captured step depends on the model and its shapes (batch, sequence, dtype, configuration), not on the
mesh: the search captures each configuration once here, as a graph document (``docs/graph-format.md``), and
every candidate of that configuration plans from it (each worker reads a document once and keeps it), so a
candidate costs its problem build and solve only. With a plan cache (the service's database), candidates
planned before, by the service or an earlier search, are read back instead of planned again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from service.access import ANONYMOUS
from service.search.budget import BudgetShares, kind_of
from service.search.cache import SearchPlanCache
from service.search.candidates import Candidate, make_candidates
from service.search.executors import Executor, make_executor
from service.search.pruning import BestSoFar, top_row_proof
from service.search.request import SearchRequest
from service.search.results import candidate_row, results_document, write_results
from service.search.screen import PipelineScreen
from service.search.task import FAILED, SKIPPED, CandidateTask


class SearchListener(Protocol):
    def started(self, total: int, reused: int) -> None:
        """The number of candidates, and how many come from the plan cache."""

    def finished(self, row: dict[str, Any]) -> None:
        """One candidate's results row (unranked)."""


class QuietListener:
    def started(self, total: int, reused: int) -> None:
        pass

    def finished(self, row: dict[str, Any]) -> None:
        pass


@dataclass
class Steering:
    """What decides, as each candidate is handed over, whether it starts, which comes next and its limits:
    the budget's shares (``None``: no budget), the best so far (``None``: no pruning), the pipelines' screen;
    ``limits``: each started candidate's solver limit."""

    shares: BudgetShares | None
    best: BestSoFar | None
    screen: PipelineScreen = field(default_factory=PipelineScreen)
    limits: dict[str, float] = field(default_factory=dict)

    def seen(self, row: dict[str, Any]) -> None:
        if self.best is not None:
            self.best.seen(row)
        self.screen.seen(row)


def search_candidates(request: SearchRequest) -> list[Candidate]:
    return make_candidates(
        request.devices,
        request.batch_sizes,
        sequence_of(request),
        request.max_mesh_dims,
        request.axis_limits,
        layers_of(request),
    )


def run_search(
    request: SearchRequest,
    out: Path | None = None,
    listener: SearchListener | None = None,
    cache_url: str | None = None,
    executor: Executor | None = None,
    say: Callable[[str], None] | None = None,
    cache_reader: str = ANONYMOUS,
    budget_from: float | None = None,
) -> dict[str, Any]:
    """Plan every candidate of ``request``; the results document (and, with ``out``, its files). With
    ``cache_url``, plans are shared with the service's database as ``cache_reader``'s. A budget counts from
    ``budget_from`` (a ``time.perf_counter()`` reading: the command's start), else from now; each candidate's
    solver limit is set as it starts (:mod:`service.search.budget`)."""
    started = time.perf_counter()
    listener = listener or QuietListener()
    say = say or (lambda message: None)
    candidates = search_candidates(request)
    nominal = request.within_budget(len(candidates))
    if nominal.time_limit_s < request.time_limit_s:
        say(
            f"budget {request.budget_s:g} s over {len(candidates)} candidates on {request.workers} workers: "
            f"each solver's limit set as it starts from the time left (about {nominal.time_limit_s:g} s)"
        )
    budget = memory_budget_bytes(request)
    cache = SearchPlanCache(cache_url, cache_reader) if cache_url else None
    rows: list[dict[str, Any]] = []
    plans: dict[str, dict[str, Any]] = {}
    steering = Steering(None, BestSoFar(margin=request.gap) if request.prune else None)

    def record(candidate: Candidate, outcome: dict[str, Any]) -> None:
        plan = outcome.get("plan")
        if plan is not None:
            plans[candidate.id] = plan
        row = candidate_row(candidate, outcome, budget, f"plans/{candidate.id}.json" if plan else None)
        rows.append(row)
        steering.seen(row)
        listener.finished(row)

    try:
        # looked up at the budget's even share: a plan stored by an earlier search under the same request
        keys = {c.id: cache.key(nominal, c) for c in candidates} if cache else {}
        cached = {c.id: plan for c in candidates if cache and (plan := cache.get(keys[c.id])) is not None}
        listener.started(len(candidates), len(cached))
        for candidate in candidates:
            if candidate.id in cached:
                plan = cached[candidate.id]
                limit = plan.get("request", {}).get("time_limit")
                record(
                    candidate,
                    {"status": plan["solver"]["status"], "plan": plan, "seconds": 0.0, "time_limit_s": limit},
                )
        by_id = {c.id: c for c in candidates}

        def unplanned(candidate: Candidate, status: str, reason: str) -> None:
            record(candidate, {"status": status, "error": reason, "seconds": 0.0})

        todo = [c for c in candidates if c.id not in cached]
        if todo and executor is None:
            executor = make_executor(request.executor, min(request.workers, len(todo)))
        threads = executor.cores_per_task if executor is not None else 1
        if request.budget_s is not None:
            steering.shares = BudgetShares(
                request.budget_s, len(todo), request.workers, request.time_limit_s, budget_from or started
            )
        work = _work(request, todo, unplanned, say, threads, steering)
        try:
            deadline = steering.shares.deadline if steering.shares is not None else None
            for outcome in executor.run(work, deadline) if executor is not None else ():
                candidate = by_id[outcome["id"]]
                limit = outcome["time_limit_s"] = steering.limits.get(candidate.id, request.time_limit_s)
                record(candidate, outcome)
                if steering.shares is not None:
                    steering.shares.finished(limit, outcome["seconds"], kind_of(candidate))
                if cache is not None and outcome.get("plan") is not None:
                    given = dataclasses.replace(request, time_limit_s=limit)
                    cache.put(cache.key(given, candidate), outcome["plan"], outcome["seconds"])
        finally:
            if executor is not None:
                executor.close()
    finally:
        if cache is not None:
            cache.close()
    order = {c.id: i for i, c in enumerate(candidates)}
    rows.sort(key=lambda row: order[row["id"]])
    results = results_document(request.record(), rows, time.perf_counter() - started)
    results["proof"] = top_row_proof(results["candidates"])
    if out is not None:
        write_results(out, results, plans)
    return results


def _work(
    request: SearchRequest,
    candidates: list[Candidate],
    unplanned: Callable[[Candidate, str, str], None],
    say: Callable[[str], None],
    threads: int,
    steering: Steering,
) -> Iterator[tuple[CandidateTask, dict[str, Any]]]:
    """Each candidate with the graph document of its configuration, captured once per batch: candidates are
    handed over as the executor asks for them (it keeps its workers busy and one task queued: the next batch
    is captured while they plan), in `dispatch_order`, the pipelines of a batch in the screen's order
    (:mod:`service.search.screen`). Under a budget each task's solver limit is set as it is handed over
    (``steering.shares``) and kept in ``steering.limits``, and a candidate the budget no longer covers does
    not start (it goes to ``unplanned``, ``skipped``, with the reason, a pipeline with its twin's step); with
    ``steering.best``, each takes a cutoff (:mod:`service.search.pruning`).
    The candidates of a configuration that cannot be captured go to ``unplanned``, ``failed``, with the
    reason. A pipeline's candidate (its first axis ``pp``) is planned from captures at its micro-batch sizes,
    each captured once too, and takes no cutoff (its step is simulated over micro-batch plans, not one
    program's objective)."""
    from strategies.graph.export import graph_digest
    from strategies.plan.pipeline_plan import microbatch_sizes
    from strategies.plan.planner import export_request_graph

    captured: dict[int, tuple[str, dict[str, Any]]] = {}

    def capture(candidate: Candidate, batch: int) -> tuple[str, dict[str, Any]]:
        if batch not in captured:
            say(f"capturing {request.model} at batch {batch}")
            document = export_request_graph(dataclasses.replace(request.plan_request(candidate), batch=batch))
            captured[batch] = (graph_digest(document), document)
        return captured[batch]

    shares, best = steering.shares, steering.best

    def refused(candidate: Candidate) -> bool:
        """Whether the budget no longer covers ``candidate``: then it is a row ``skipped`` saying why."""
        plans = len(microbatch_sizes(candidate.mesh[0], candidate.batch)) if candidate.pipelined else 1
        refusal = shares.refusal(kind_of(candidate), plans=plans) if shares is not None else None
        if shares is None or refusal is None:
            return False
        shares.passed_over()
        found = steering.screen.twin_step(candidate) if candidate.pipelined else None
        twin_said = f" (its twin without a pipeline, {found[1]}: {found[0]:.3g} s)" if found else ""
        unplanned(candidate, SKIPPED, refusal + twin_said)
        return True

    pending = dispatch_order(candidates)
    while pending:
        candidate = steering.screen.take_next(pending)
        if refused(candidate):
            continue
        batch = candidate.batch
        pipelined = candidate.pipelined
        sizes = microbatch_sizes(candidate.mesh[0], batch) if pipelined else [batch]
        try:
            documents = {size: capture(candidate, size) for size in sizes}
        except Exception as error:
            first_line = (str(error).splitlines() or [""])[0]
            if shares is not None:
                shares.passed_over()
            unplanned(candidate, FAILED, f"capture failed: {type(error).__name__}: {first_line}")
            continue
        if pipelined and refused(candidate):  # its captures took what was left (kept for the next pipeline)
            continue
        plan_request = request.plan_request(candidate)
        if shares is not None:
            limit = shares.next_limit(kind=kind_of(candidate))
            plan_request = dataclasses.replace(plan_request, time_limit=limit)
        if best is not None and not pipelined:  # a pipeline's cost is no program's objective
            plan_request = dataclasses.replace(plan_request, cutoff_s=best.cutoff(candidate))
        steering.limits[candidate.id] = plan_request.time_limit
        if pipelined:
            digests = {size: digest for size, (digest, _) in documents.items()}
            task = CandidateTask(candidate.id, plan_request, "", threads, digests)
            yield task, {size: document for size, (_, document) in documents.items()}
        else:
            digest, document = documents[batch]
            yield CandidateTask(candidate.id, plan_request, digest, threads), document


def dispatch_order(candidates: list[Candidate]) -> list[Candidate]:
    """The order candidates start in, the most promising first, so that pruning has a best to cut against
    early and a budget spent before the end skips the least promising: the largest batch first (its
    collectives are paid over more tokens), pipelines after every mesh without one at that batch (each is
    several micro-batch plans; at 64 devices they were 10-15% slower than the best), then the meshes of more
    axes first (they take longest: the pool ends more evenly). The pipelines of a batch are then taken in
    the order of :mod:`service.search.screen` as they start (it reads the plans finished by then)."""
    return sorted(candidates, key=lambda c: (-c.batch, c.pipelined, -len(c.mesh)))


def sequence_of(request: SearchRequest) -> int | None:
    """The sequence length the candidates run at: ``None`` for a model without one (``mlp``, a factory)."""
    from strategies.models import MODELS
    from strategies.plan.planner import DEFAULT_SEQ

    has_sequence = getattr(MODELS.get(request.model), "config", None) is not None
    return (request.seq or DEFAULT_SEQ) if has_sequence else None


def layers_of(request: SearchRequest) -> int | None:
    """The depth the candidates' model has (None for a model without layers: ``mlp``, a factory)."""
    from strategies.models.builder import model_layers

    return request.layers or model_layers(request.model, **request.options)


def memory_budget_bytes(request: SearchRequest) -> int:
    from strategies.cost.hardware import get_hardware

    if request.memory_gib is not None:
        return int(request.memory_gib * 2**30)
    return get_hardware(request.hardware).memory_bytes
