"""The ranking table of the report: one row per candidate, best first, sortable by any column.

Each row carries its sort keys as ``data-*`` attributes (the page's small script sorts on them), so cells
may span columns: a failed candidate's error spans the figures it does not have.
"""

from __future__ import annotations

from typing import Any

from service.search.report.format import (
    DASH,
    axes_text,
    count_text,
    esc,
    mapping,
    mesh_text,
    number,
    percent_text,
    rate_text,
    seconds_text,
    size_text,
    throughput,
)

PLANNED = ("optimal", "feasible")
COLUMNS = [
    ("rank", "rank", "num"),
    ("candidate", "id", "text"),
    ("mesh", "mesh", "text"),
    ("axes", "axes", "text"),
    ("batch", "batch", "num"),
    ("status", "status", "text"),
    ("step time", "step", "num"),
    ("throughput", "rate", "num"),
    ("peak memory per device / budget", "peak", "num"),
    ("certificate gap", "gap", "num"),
    ("planned in", "seconds", "num"),
]
"""(header, sort key, kind) per column."""


def ranked_order(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranked candidates by rank, then infeasible ones by the smallest peak they could reach, then the rest
    (failed) by id."""

    def key(candidate: dict[str, Any]) -> tuple[int, float, str]:
        rank = number(candidate.get("rank"))
        if rank is not None:
            return (0, rank, "")
        if candidate.get("status") == "infeasible":
            return (1, number(candidate.get("min_peak_bytes")) or float("inf"), str(candidate.get("id")))
        return (2, 0.0, str(candidate.get("id")))

    return sorted(candidates, key=key)


def ranking_table(candidates: list[dict[str, Any]], unit: str) -> str:
    head = "".join(
        f'<th data-key="{key}" data-kind="{kind}" title="sort by {esc(name)}">{esc(name)}</th>'
        for name, key, kind in COLUMNS
    )
    rows = "\n".join(_row(c, unit) for c in ranked_order(candidates))
    return (
        f'<div class="scroll"><table id="ranking" class="ranking"><thead><tr>{head}</tr></thead>'
        f"<tbody>\n{rows}\n</tbody></table></div>"
    )


def _row(candidate: dict[str, Any], unit: str) -> str:
    status = str(candidate.get("status", DASH))
    rank = number(candidate.get("rank"))
    certificate = mapping(candidate, "certificate")
    keys = {
        "rank": rank,
        "id": candidate.get("id"),
        "mesh": mesh_text(candidate.get("mesh")),
        "axes": axes_text(candidate.get("axis_names")),
        "batch": number(candidate.get("batch")),
        "status": status,
        "step": number(candidate.get("step_time_s")),
        "rate": throughput(candidate),
        "peak": number(candidate.get("peak_memory_bytes")) or number(candidate.get("min_peak_bytes")),
        "gap": number(certificate.get("gap")),
        "seconds": number(candidate.get("seconds")),
    }
    data = " ".join(f'data-{k}="{esc(_sort_value(v))}"' for k, v in keys.items())
    cells = [
        f'<td class="num">{count_text(rank)}</td>',
        f"<td><code>{esc(candidate.get('id', DASH))}</code></td>",
        f'<td class="nowrap">{esc(keys["mesh"])}</td>',
        f'<td class="nowrap">{esc(keys["axes"])}{_pipeline_note(candidate)}</td>',
        f'<td class="num">{count_text(keys["batch"])}</td>',
        f'<td><span class="badge {_status_class(status)}">{esc(status)}</span></td>',
    ]
    cells += _figures(candidate, status, unit, certificate)
    cells.append(f'<td class="num">{esc(seconds_text(candidate.get("seconds")))}</td>')
    winner = " winner" if rank == 1 else ""
    return f'<tr class="row-{_status_class(status)}{winner}" {data}>{"".join(cells)}</tr>'


def _pipeline_note(candidate: dict[str, Any]) -> str:
    """A pipeline's schedule under its axes: what the ``pp`` axis runs."""
    pipeline = mapping(candidate, "pipeline")
    if not pipeline:
        return ""
    chunks = number(pipeline.get("chunks")) or 1
    per_rank = f", {count_text(chunks)} stages per rank" if chunks > 1 else ""
    microbatches = count_text(pipeline.get("microbatches"))
    text = f"{pipeline.get('schedule', DASH)}, {microbatches} micro-batches{per_rank}"
    return f'<br><small class="pipeline">{esc(text)}</small>'


def _figures(candidate: dict[str, Any], status: str, unit: str, certificate: dict[str, Any]) -> list[str]:
    """The step time, throughput, memory and gap cells; for a pruned candidate its bound, for a failed one
    its error across them."""
    if status in PLANNED:
        return [
            f'<td class="num">{esc(seconds_text(candidate.get("step_time_s")))}</td>',
            f'<td class="num">{esc(rate_text(throughput(candidate)))} {esc(unit)}</td>',
            f"<td>{_memory_cell(candidate)}</td>",
            f'<td class="num">{esc(percent_text(certificate.get("gap")))}</td>',
        ]
    if status == "infeasible":
        budget = size_text(candidate.get("memory_budget_bytes"))
        if number(candidate.get("min_peak_bytes")) is None:
            text = f"no plan fits the budget of {budget}"
        else:
            text = f"smallest peak {size_text(candidate.get('min_peak_bytes'))} > budget {budget}"
        return [
            f'<td class="num">{DASH}</td>',
            f'<td class="num">{DASH}</td>',
            f'<td class="over">{esc(text)}</td>',
            f'<td class="num">{DASH}</td>',
        ]
    if status == "pruned":
        bound = seconds_text(certificate.get("bound_s"))
        text = f"pruned: its bound, {bound} per step, proves no plan of it beats the best per token"
        return [f'<td colspan="4">{esc(text)}</td>']
    error = candidate.get("error") or "no reason given"
    return [f'<td colspan="4" class="error">{esc(error)}</td>']


def _memory_cell(candidate: dict[str, Any]) -> str:
    peak = number(candidate.get("peak_memory_bytes"))
    budget = number(candidate.get("memory_budget_bytes"))
    text = f"{size_text(peak)} / {size_text(budget)}"
    if peak is None or budget is None or budget <= 0:
        return esc(text)
    share = peak / budget
    width = min(100.0, 100 * share)
    return (
        f'<div class="mem"><div class="bar"><i style="width:{width:.1f}%"></i></div>'
        f"<span>{esc(text)} ({100 * share:.0f}%)</span></div>"
    )


def _sort_value(value: Any) -> str:
    """A sort key as attribute text: whole numbers without ``.0``, others at full precision."""
    if value is None:
        return ""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _status_class(status: str) -> str:
    return status if status in ("optimal", "feasible", "infeasible", "failed") else "other"
