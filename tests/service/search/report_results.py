"""A real search's results for the report's tests, built the way ``autoshard search`` builds them.

Each candidate of ``mlp`` (wide enough that tensor parallelism matters) over 8 devices is planned with
:func:`~strategies.plan.planner.plan_model` under one memory budget; the largest batch does not fit it, so
those candidates are infeasible with the smallest peak the solver proves. Two candidates fail: an
impossible mesh (three axes, two names) and a model name that is markup (its error quotes it).
Results follow the search's ``results.json`` contract (format ``autoshard.search``, version 1).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from solver.errors import InfeasibleError
from solver.evaluate import usage_profile
from strategies.plan.planner import PlanOutcome, PlanRequest, plan_model

DEVICES = 8
MESHES = {"8": "dp", "2x4": "dp,tp", "4x2": "dp,tp", "2x2x2": "dp,cp,tp"}
BATCHES = (256, 2048, 4096)
MEMORY_GIB = 0.8
OPTIONS = {"d": 8192, "h": 32768}
TIME_LIMIT_S = 10.0
PROFILE_POINTS = 256
HOSTILE_MODEL = "<script>alert('autoshard')</script>"
FAILURES = [
    # (mesh, axis names, model): planning each raises
    ("2x2x2", "dp,tp", "mlp"),
    ("2x4", "dp,tp", HOSTILE_MODEL),
]


def build_results(out: Path) -> dict[str, Any]:
    """Plan every candidate, write ``out/results.json`` and ``out/plans/<id>.json``; return the results."""
    (out / "plans").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    candidates = []
    jobs = [(mesh, axes, "mlp", batch) for mesh, axes in MESHES.items() for batch in BATCHES]
    jobs += [(mesh, axes, model, BATCHES[0]) for mesh, axes, model in FAILURES]
    for k, (mesh, axes, model, batch) in enumerate(jobs):
        candidates.append(_candidate(f"c{k:02d}", mesh, axes, model, batch, out))
    _rank(candidates)
    results = {
        "format": "autoshard.search",
        "version": 1,
        "request": {
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
        },
        "wall_s": time.perf_counter() - started,
        "candidates": candidates,
        "pareto": pareto_front(candidates),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


def _candidate(cid: str, mesh: str, axes: str, model: str, batch: int, out: Path) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": cid,
        "mesh": [int(size) for size in mesh.split("x")],
        "axis_names": axes.split(","),
        "batch": batch,
        "seq": None,
        "rank": None,
        "memory_budget_bytes": int(MEMORY_GIB * 2**30),
        "min_peak_bytes": None,
        "plan_file": None,
        "error": None,
        "certificate": None,
    }
    for key in ("step_time_s", "compute_s", "comm_s", "exposed_comm_s", "load_s", "samples_per_s"):
        record[key] = None
    record["tokens_per_s"] = None
    record["peak_memory_bytes"] = None
    request = PlanRequest(
        model=model,
        mesh=mesh,
        axis_names=axes,
        batch=batch,
        memory_gib=MEMORY_GIB,
        time_limit=TIME_LIMIT_S,
        options=OPTIONS if model == "mlp" else {},
    )
    started = time.perf_counter()
    try:
        outcome = plan_model(request)
    except InfeasibleError as error:
        record.update(status="infeasible", min_peak_bytes=error.min_peak, error=str(error))
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
    else:
        record.update(_planned(outcome, batch))
        plan = outcome.plan
        plan["predicted"].setdefault("memory_profile", memory_profile(outcome))
        record["plan_file"] = f"plans/{cid}.json"
        (out / record["plan_file"]).write_text(json.dumps(plan))
    record["seconds"] = time.perf_counter() - started
    return record


def _planned(outcome: PlanOutcome, batch: int) -> dict[str, Any]:
    predicted, solver = outcome.plan["predicted"], outcome.plan["solver"]
    step = predicted["step_time_s"]
    return {
        "status": solver["status"],
        "step_time_s": step,
        "compute_s": predicted["compute_s"],
        "comm_s": predicted["comm_s"],
        "exposed_comm_s": step - predicted["compute_s"] - predicted["load_s"],
        "load_s": predicted["load_s"],
        "samples_per_s": batch / step,
        "peak_memory_bytes": predicted["peak_memory_bytes"],
        "certificate": {
            "status": solver["status"],
            "bound_s": solver["bound"],
            "gap": solver["gap"],
            "backend": solver["backend"],
        },
    }


def memory_profile(outcome: PlanOutcome) -> dict[str, list[int]]:
    """Live bytes per device at each step position, at most ``PROFILE_POINTS`` of them: each bucket of
    consecutive positions keeps its largest value (so the peak survives)."""
    chosen = np.asarray(outcome.result.solution, dtype=np.int64)
    positions, usage = usage_profile(outcome.built.problem, chosen)
    buckets = np.array_split(np.arange(len(usage)), min(PROFILE_POINTS, len(usage)))
    keep = [int(bucket[np.argmax(usage[bucket])]) for bucket in buckets if len(bucket)]
    return {"positions": positions[keep].tolist(), "bytes": usage[keep].tolist()}


def _rank(candidates: list[dict[str, Any]]) -> None:
    """Rank the candidates with a plan by predicted samples per second, best first."""
    planned = [c for c in candidates if c["status"] in ("optimal", "feasible")]
    for rank, candidate in enumerate(sorted(planned, key=lambda c: -c["samples_per_s"]), start=1):
        candidate["rank"] = rank


def pareto_front(candidates: list[dict[str, Any]]) -> list[str]:
    """Ids of the candidates with a plan that no other beats on both throughput and peak memory."""
    planned = [c for c in candidates if c["rank"] is not None]

    def beaten(c: dict[str, Any]) -> bool:
        return any(
            o["samples_per_s"] >= c["samples_per_s"]
            and o["peak_memory_bytes"] <= c["peak_memory_bytes"]
            and (o["samples_per_s"], o["peak_memory_bytes"]) != (c["samples_per_s"], c["peak_memory_bytes"])
            for o in planned
        )

    return [c["id"] for c in planned if not beaten(c)]
