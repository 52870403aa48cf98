"""A search's results: one row per candidate, ranked by throughput, the Pareto front, and the files.

``results.json`` (format ``autoshard.search``, version 1) holds the request, the wall time, every candidate
and the Pareto front; ``results.csv`` one row per candidate; ``plans/<id>.json`` the plan of each candidate
that has one. Figures come from the plan's ``predicted`` block: ``comm_s`` is all the step's communication,
``exposed_comm_s`` the part the two-stream schedule could not hide behind compute
(:mod:`strategies.plan.schedule`), ``contention_s`` the compute the hidden part slows; the step time is
``compute_s + exposed_comm_s + contention_s + load_s``. Throughput is ``batch / step_time_s`` samples per
second (and ``batch * seq / step_time_s`` tokens for a model with a sequence).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from service.search.candidates import Candidate
from service.search.task import FEASIBLE, OPTIMAL

FORMAT, VERSION = "autoshard.search", 1
CSV_COLUMNS = (
    "id", "mesh", "axis_names", "batch", "seq", "status", "rank", "step_time_s", "compute_s", "comm_s",
    "exposed_comm_s", "contention_s", "load_s", "recompute_s", "recomputed", "samples_per_s", "tokens_per_s",
    "peak_memory_bytes", "memory_budget_bytes",
    "min_peak_bytes", "certificate_status", "objective_s", "bound_s", "gap", "backend", "plan_file", "error",
    "time_limit_s", "seconds",
)  # fmt: skip


def candidate_row(
    candidate: Candidate, outcome: dict[str, Any], budget_bytes: int, plan_file: str | None
) -> dict[str, Any]:
    """The results row of one candidate from its outcome (:func:`service.search.task.plan_candidate`)."""
    plan = outcome.get("plan")
    row: dict[str, Any] = {
        "id": candidate.id,
        "mesh": list(candidate.mesh),
        "axis_names": list(candidate.axis_names),
        "batch": candidate.batch,
        "seq": candidate.seq,
        "status": outcome["status"],
        "rank": None,
        **dict.fromkeys(
            ("step_time_s", "compute_s", "comm_s", "exposed_comm_s", "contention_s", "load_s", "recompute_s")
        ),
        "recomputed": None,
        "samples_per_s": None,
        "tokens_per_s": None,
        "peak_memory_bytes": None,
        "memory_budget_bytes": budget_bytes,
        "min_peak_bytes": outcome.get("min_peak_bytes"),
        "certificate": None,
        "plan_file": plan_file,
        "error": outcome.get("error"),
        "time_limit_s": outcome.get("time_limit_s"),
        "seconds": round(float(outcome.get("seconds", 0.0)), 3),
        "pipeline": None,
    }
    if outcome.get("bound_s") is not None:  # pruned: no plan, the bound that proves it could not win
        row["certificate"] = {
            "status": outcome["status"],
            "objective_s": None,
            "bound_s": outcome["bound_s"],
            "gap": None,
            "backend": None,
        }
    if plan is None:
        return row
    predicted, solver = plan["predicted"], plan["solver"]
    step = float(predicted["step_time_s"])
    pipeline = plan.get("pipeline")
    if pipeline:  # its certificate is its micro-batch plan's: no objective or bound of the whole step
        row["pipeline"] = {
            "schedule": pipeline["schedule"],
            "chunks": pipeline.get("chunks", 1),
            "microbatches": pipeline["microbatches"],
            "bubble_s": predicted.get("bubble_s"),
        }
    row.update(
        step_time_s=step,
        compute_s=predicted["compute_s"],
        comm_s=predicted["comm_s"],
        exposed_comm_s=predicted.get("exposed_comm_s", predicted["comm_s"]),
        contention_s=predicted.get("contention_s", 0.0),
        load_s=predicted.get("load_s", 0.0),
        recompute_s=predicted.get("recompute_s", 0.0),
        recomputed=len(plan.get("recompute", [])),
        samples_per_s=candidate.batch / step if step > 0 else None,
        tokens_per_s=candidate.batch * candidate.seq / step if step > 0 and candidate.seq else None,
        peak_memory_bytes=predicted["peak_memory_bytes"],
        certificate={
            "status": solver["status"],
            "objective_s": None if pipeline else solver["objective"],
            "bound_s": None if pipeline else solver["bound"],
            "gap": solver["gap"],
            "backend": solver["backend"],
        },
    )
    return row


def has_plan(row: dict[str, Any]) -> bool:
    return row["status"] in (OPTIMAL, FEASIBLE) and row["samples_per_s"] is not None


def rank_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with a plan ranked 1, 2, … by throughput (samples per second, then less memory, then id);
    the others unranked after them, in candidate order."""
    planned = sorted(
        (row for row in rows if has_plan(row)),
        key=lambda row: (-row["samples_per_s"], row["peak_memory_bytes"], row["id"]),
    )
    for rank, row in enumerate(planned, start=1):
        row["rank"] = rank
    others = [row for row in rows if not has_plan(row)]
    return planned + others


def pareto_front(rows: list[dict[str, Any]]) -> list[str]:
    """Ids of the planned rows no other planned row beats on both throughput (higher) and peak memory per
    device (lower), by decreasing throughput."""
    planned = sorted(
        (row for row in rows if has_plan(row)),
        key=lambda row: (-row["samples_per_s"], row["peak_memory_bytes"], row["id"]),
    )
    front, least_memory = [], None
    for row in planned:
        if least_memory is None or row["peak_memory_bytes"] < least_memory:
            front.append(row["id"])
            least_memory = row["peak_memory_bytes"]
    return front


def results_document(request: dict[str, Any], rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    ranked = rank_rows(rows)
    return {
        "format": FORMAT,
        "version": VERSION,
        "request": request,
        "wall_s": round(wall_s, 3),
        "candidates": ranked,
        "pareto": pareto_front(ranked),
    }


def write_results(out: Path, results: dict[str, Any], plans: dict[str, dict[str, Any]]) -> None:
    """``results.json``, ``results.csv`` and ``plans/<id>.json`` under ``out`` (created)."""
    (out / "plans").mkdir(parents=True, exist_ok=True)
    for candidate_id, plan in plans.items():
        (out / "plans" / f"{candidate_id}.json").write_text(json.dumps(plan, indent=1))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in results["candidates"]:
            writer.writerow(csv_row(row))


def csv_row(row: dict[str, Any]) -> dict[str, Any]:
    certificate = row["certificate"] or {}
    flat = {name: row.get(name) for name in CSV_COLUMNS if name in row}
    flat["mesh"] = "x".join(str(size) for size in row["mesh"])
    flat["axis_names"] = ",".join(row["axis_names"])
    flat.update(
        certificate_status=certificate.get("status"),
        objective_s=certificate.get("objective_s"),
        bound_s=certificate.get("bound_s"),
        gap=certificate.get("gap"),
        backend=certificate.get("backend"),
    )
    return {name: "" if value is None else value for name, value in flat.items()}
