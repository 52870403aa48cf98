"""Pruning a search, and whether its top row is proven best.

Every candidate's program has the same objective, step seconds; candidates of different batches compare per
token (per sample for a model without a sequence). A candidate handed to a worker gets a cutoff: the least
objective per token among the candidates finished, times its own tokens per step, plus the search's gap (a
near tie is planned to the end and keeps its row: the solver only promises plans within the gap anyway;
llama3-8b on 64 devices without it pruned the runner-up, 0.2% behind). Its solve stops once its
bound passes the cutoff (`strategies.plan.planner.PrunedError`), and the row is ``pruned`` with that bound:
no plan of it can beat the best found. The time it did not take goes to the candidates after it (the
budget, :mod:`service.search.budget`).

At the end (`top_row_proof`) the top row is proven best when its objective per token is at most every other
candidate's bound per token (an infeasible candidate is out; one that failed, or a pipeline, whose step is
simulated over micro-batch plans and has no bound, leaves the ranking unproven). The
proof is the program's: the ranking is by the simulated step, which for the plans within a gap agrees with
the objective to about a percent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.search.candidates import Candidate
from service.search.results import has_plan
from service.search.task import INFEASIBLE


def tokens(batch: int, seq: int | None) -> int:
    """What one step processes: ``batch x seq`` tokens, or ``batch`` samples without a sequence."""
    return batch * (seq or 1)


@dataclass
class BestSoFar:
    """The least objective per token among the rows finished so far; a cutoff leaves ``margin`` above it (the
    search's gap: a candidate within the solver's own tolerance of the best is planned to the end, so near
    ties keep their rows)."""

    margin: float = 0.0
    per_token_s: float | None = None

    def seen(self, row: dict[str, Any]) -> None:
        objective = (row.get("certificate") or {}).get("objective_s")
        if not has_plan(row) or objective is None:
            return
        rate = objective / tokens(row["batch"], row["seq"])
        if self.per_token_s is None or rate < self.per_token_s:
            self.per_token_s = rate

    def cutoff(self, candidate: Candidate) -> float | None:
        """Step seconds a plan of ``candidate`` must cost less than to beat the best so far."""
        if self.per_token_s is None:
            return None
        return self.per_token_s * tokens(candidate.batch, candidate.seq) * (1.0 + self.margin)


def top_row_proof(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Whether the top-ranked row is proven best: ``{"top", "proven", "below": [ids of the rows whose bound
    per token is below its objective per token], "unknown": [ids of those without a bound], "closest",
    "shortfall"}`` (``closest``: the row of least bound per token among ``below``; ``shortfall``: how far
    below the top row's objective that bound is, as a share of it). None without a ranked row."""
    top = next((row for row in rows if row.get("rank") == 1), None)
    if top is None:
        return None
    # a pipeline's step is its schedule simulated over its micro-batch plan: no program of its own, no bound
    pipeline = bool(top.get("pipeline"))
    objective = top.get("step_time_s") if pipeline else (top.get("certificate") or {}).get("objective_s")
    if objective is None:
        return None
    top_rate = objective / tokens(top["batch"], top["seq"])
    below: list[str] = []
    unknown: list[str] = []
    closest, shortfall = None, 0.0
    for row in rows:
        bound = (row.get("certificate") or {}).get("bound_s")
        if row is top or row["status"] == INFEASIBLE:
            continue
        if bound is None:
            unknown.append(row["id"])
            continue
        short = (top_rate - bound / tokens(row["batch"], row["seq"])) / top_rate
        if short > 0:
            below.append(row["id"])
            if short > shortfall:
                closest, shortfall = row["id"], short
    proven = not below and not unknown and not pipeline
    return {"top": top["id"], "proven": proven, "below": below, "unknown": unknown, "closest": closest,
            "shortfall": shortfall, "pipeline": pipeline}  # fmt: skip


def proof_text(proof: dict[str, Any] | None) -> str:
    """The proof as a sentence (the CLI's last line, the report's header)."""
    if proof is None:
        return "no candidate has a plan"
    if proof["proven"]:
        return f"{proof['top']} is proven best: no other candidate's bound per token is below its cost"
    parts = []
    if proof.get("pipeline"):
        parts.append("a pipeline, its step simulated from a micro-batch plan: no bound of its own")
    if proof["below"]:
        parts.append(
            f"{len(proof['below'])} candidates' bounds per token are below its cost, "
            f"{proof['closest']}'s the most, by {proof['shortfall']:.2%}"
        )
    if proof["unknown"]:
        parts.append(f"{len(proof['unknown'])} without a bound (skipped, failed, or pipelines)")
    return f"{proof['top']} is not proven best: " + "; ".join(parts)


__all__ = ["BestSoFar", "proof_text", "tokens", "top_row_proof"]
