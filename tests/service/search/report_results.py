"""A real search's results for the report's tests, built the way ``autoshard search`` builds them.

Each candidate of ``mlp`` (wide enough that tensor parallelism matters) over 8 devices is planned with
:func:`~strategies.plan.planner.plan_model` under one memory budget; the largest batch does not fit it, so
those candidates are infeasible with the smallest peak the solver proves. Two candidates fail: an
impossible mesh (three axes, two names) and a model name that is markup (its error quotes it).
Rows, ranking, Pareto front and files come from the search's own code (:mod:`service.search.results`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from service.search.candidates import Candidate
from service.search.results import candidate_row, results_document, write_results
from solver.errors import InfeasibleError
from strategies.plan.planner import PlanRequest, plan_model

DEVICES = 8
MESHES = {"8": "dp", "2x4": "dp,tp", "4x2": "dp,tp", "2x2x2": "dp,cp,tp"}
BATCHES = (256, 2048, 4096)
MEMORY_GIB = 0.56  # batch 2048 peaks at 0.54-0.55 GiB; 4096 reaches 0.57 GiB at least (Adam in bf16)
OPTIONS = {"d": 8192, "h": 32768}
TIME_LIMIT_S = 10.0
HOSTILE_MODEL = "<script>alert('autoshard')</script>"
FAILURES = [
    # (mesh, axis names, model): planning each raises
    ("2x2x2", "dp,tp", "mlp"),
    ("2x4", "dp,tp", HOSTILE_MODEL),
]


def build_results(out: Path) -> dict[str, Any]:
    """Plan every candidate, write ``out/results.json``, ``results.csv`` and ``out/plans/<id>.json`` with the
    search's own row, ranking and file code (:mod:`service.search.results`); return the results."""
    started = time.perf_counter()
    budget = int(MEMORY_GIB * 2**30)
    rows, plans = [], {}
    jobs = [(mesh, axes, "mlp", batch) for mesh, axes in MESHES.items() for batch in BATCHES]
    jobs += [(mesh, axes, model, BATCHES[0]) for mesh, axes, model in FAILURES]
    for k, (mesh, axes, model, batch) in enumerate(jobs):
        candidate = Candidate(
            f"c{k:02d}", tuple(int(size) for size in mesh.split("x")), tuple(axes.split(",")), batch, None
        )
        outcome = _outcome(candidate, model)
        plan_file = None
        if outcome["plan"] is not None:
            plans[candidate.id] = outcome["plan"]
            plan_file = f"plans/{candidate.id}.json"
        rows.append(candidate_row(candidate, outcome, budget, plan_file))
    request = {
        "model": "mlp",
        "devices": DEVICES,
        "hardware": "h100",
        "memory_gib": MEMORY_GIB,
        "batch_sizes": list(BATCHES),
        "seq": None,
        "max_mesh_dims": 3,
        "executor": "local",
        "workers": 1,
        "time_limit_s": TIME_LIMIT_S,
    }
    results = results_document(request, rows, time.perf_counter() - started)
    write_results(out, results, plans)
    return results


def _outcome(candidate: Candidate, model: str) -> dict[str, Any]:
    """What a search worker reports for one candidate (:func:`service.search.task.plan_candidate`), planned
    here with :func:`plan_model`."""
    request = PlanRequest(
        model=model,
        mesh=candidate.mesh_text,
        axis_names=",".join(candidate.axis_names),
        batch=candidate.batch,
        memory_gib=MEMORY_GIB,
        time_limit=TIME_LIMIT_S,
        options=OPTIONS if model == "mlp" else {},
    )
    started = time.perf_counter()
    outcome: dict[str, Any] = {"plan": None, "min_peak_bytes": None, "error": None}
    try:
        plan = plan_model(request).plan
    except InfeasibleError as error:
        outcome.update(status="infeasible", min_peak_bytes=error.min_peak, error=str(error))
    except Exception as error:
        outcome.update(status="failed", error=f"{type(error).__name__}: {error}")
    else:
        outcome.update(status=plan["solver"]["status"], plan=plan)
    outcome["seconds"] = time.perf_counter() - started
    return outcome
