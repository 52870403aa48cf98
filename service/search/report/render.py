"""The search report: one self-contained HTML page over a search's ``results.json`` and ``plans/``.

What a person sizing a cluster looks at: the header (model, devices, budget, counts, wall time), the
ranking table, predicted throughput against peak memory per device with the Pareto front, where each
candidate's step time goes, and the winner's plan (placements by layer, collectives, memory over the step).
Plots are inline SVG (their text is text), the style sheet and the sorting script are inline: the file loads
nothing from anywhere. Every string taken from the results is escaped.

:func:`render_report` is the one entry point; the CLI writes its page next to ``results.json`` and the
service serves it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.search.pruning import proof_text, top_row_proof
from service.search.report.assets import CSS, SORT_SCRIPT
from service.search.report.format import (
    DASH,
    axes_text,
    esc,
    mapping,
    mesh_text,
    number,
    seconds_text,
    throughput_unit,
)
from service.search.report.plan import winner_section
from service.search.report.plots import MAX_BARS, throughput_memory_plot, time_breakdown_plot
from service.search.report.table import PLANNED, ranked_order, ranking_table

RESULTS_FORMAT = "autoshard.search"
RESULTS_VERSION = 1
REPORT_NAME = "report.html"


def render_report(results: dict[str, Any], results_dir: Path) -> str:
    """The report page of a search's ``results`` (``results.json``, read), whose plan files lie under
    ``results_dir``. Raises ValueError naming the field when ``results`` is not a search's results."""
    candidates = _check(results)
    request = mapping(results, "request")
    unit = throughput_unit(candidates)
    ranked = [c for c in ranked_order(candidates) if number(c.get("rank")) is not None]
    model = str(request.get("model", DASH))
    body = [
        _header(results, request, candidates),
        _section("ranking-section", "Ranking", ranking_table(candidates, unit), _ranking_caption(unit)),
        _section(
            "throughput",
            "Throughput against memory",
            throughput_memory_plot(candidates, _pareto(results)) or _none("No candidate has a plan to draw."),
            "Each point is a candidate with a plan; the Pareto front (no other candidate is both faster and "
            "smaller) is joined up and labelled with mesh and batch (2x4 b16: a 2x4 mesh, batch 16), the "
            "winner starred. Infeasible candidates sit on the floor at the smallest peak any of their plans "
            "could reach; the dashed line is the memory budget.",
        ),
        _section(
            "step-time",
            "Where the step time goes",
            time_breakdown_plot(ranked) or _none("No candidate is ranked."),
            _time_caption(len(ranked)),
        ),
        _winner(ranked, results_dir, unit),
    ]
    return _page(f"autoshard search: {model}", "\n".join(body))


def write_report(results_dir: Path) -> Path:
    """Render ``results_dir/results.json`` into ``results_dir/report.html``; returns the page's path."""
    results = json.loads((results_dir / "results.json").read_text())
    path = results_dir / REPORT_NAME
    path.write_text(render_report(results, results_dir), encoding="utf-8")
    return path


def _check(results: Any) -> list[dict[str, Any]]:
    if not isinstance(results, dict):
        raise ValueError(f"results: expected a JSON object, got {type(results).__name__}")
    if results.get("format") != RESULTS_FORMAT:
        raise ValueError(f"format: expected {RESULTS_FORMAT!r}, got {results.get('format')!r}")
    if results.get("version") != RESULTS_VERSION:
        raise ValueError(
            f"version: this report reads version {RESULTS_VERSION}, got {results.get('version')!r}"
        )
    candidates = results.get("candidates")
    if not isinstance(candidates, list) or not all(isinstance(c, dict) for c in candidates):
        raise ValueError("candidates: expected a list of objects")
    return candidates


def _pareto(results: dict[str, Any]) -> list[str]:
    pareto = results.get("pareto")
    return [str(p) for p in pareto] if isinstance(pareto, list) else []


def _time_limits(request: dict[str, Any], candidates: list[dict[str, Any]]) -> str:
    """The solver's limit per plan: as asked, or under a budget the range given (set as each started)."""
    given = sorted(limit for c in candidates if (limit := number(c.get("time_limit_s"))) is not None)
    asked = seconds_text(request.get("time_limit_s"))
    if not request.get("budget_s") or not given:
        return asked
    spread = seconds_text(given[0]) if given[0] == given[-1] else f"{given[0]:.3g}-{given[-1]:.3g} s"
    return f"{spread} from the budget (at most {asked})"


def _header(results: dict[str, Any], request: dict[str, Any], candidates: list[dict[str, Any]]) -> str:
    statuses = [c.get("status") for c in candidates]
    planned = sum(status in PLANNED for status in statuses)
    budget = number(request.get("memory_gib"))
    batches = request.get("batch_sizes")
    facts = [
        ("devices", request.get("devices", DASH)),
        ("hardware", request.get("hardware", DASH)),
        ("memory budget", f"{budget:g} GiB per device" if budget is not None else "the hardware's capacity"),
        ("batch sizes", ", ".join(str(b) for b in batches) if isinstance(batches, list) else DASH),
        ("sequence", request.get("seq") if request.get("seq") is not None else DASH),
        ("candidates", len(candidates)),
        ("with a plan", planned),
        ("infeasible", statuses.count("infeasible")),
        ("failed", statuses.count("failed")),
        ("wall time", seconds_text(results.get("wall_s"))),
        ("executor", f"{request.get('executor', DASH)} x {request.get('workers', DASH)}"),
        ("time limit per plan", _time_limits(request, candidates)),
        ("budget", seconds_text(request.get("budget_s")) if request.get("budget_s") else "none"),
        ("pruned", statuses.count("pruned")),
        ("the top row", proof_text(results["proof"] if "proof" in results else top_row_proof(candidates))),
    ]
    cells = "".join(f'<div class="fact"><span>{esc(k)}</span><b>{esc(v)}</b></div>' for k, v in facts)
    model = esc(request.get("model", DASH))
    subtitle = (
        f"Every mesh of up to {esc(request.get('max_mesh_dims', DASH))} axes over "
        f"{esc(request.get('devices', DASH))} devices with each batch size, planned and ranked."
    )
    return (
        f'<header><h1>Plan search: {model}</h1><p class="subtitle">{subtitle}</p>'
        f'<div class="facts">{cells}</div></header>'
    )


def _ranking_caption(unit: str) -> str:
    return (
        f"The search's ranking, rank 1 first; throughput in {unit}; click a column to sort. The gap is how "
        "far a plan may be from the best plan of its candidate (its solver's certificate). Infeasible rows "
        "show the smallest peak their plans could reach; failed rows their error."
    )


def _time_caption(ranked: int) -> str:
    shown = (
        f"the best {MAX_BARS} of the {ranked} ranked candidates"
        if ranked > MAX_BARS
        else "each ranked candidate"
    )
    return (
        f"Predicted step time of {shown}, best at the top: compute, communication not hidden behind compute, "
        "and loading the inputs."
    )


def _winner(ranked: list[dict[str, Any]], results_dir: Path, unit: str) -> str:
    if not ranked:
        return _section("winner", "The winner", _none("No candidate has a plan: there is no winner."), "")
    best = ranked[0]
    plan, problem = _read_plan(results_dir, best.get("plan_file"))
    title = (
        f"The winner: {mesh_text(best.get('mesh'))} ({axes_text(best.get('axis_names'))}), "
        f"batch {best.get('batch', DASH)}"
    )
    caption = f"Candidate {best.get('id', DASH)}, plan file {best.get('plan_file') or DASH}."
    return _section("winner", title, winner_section(best, plan, problem, unit), caption)


def _read_plan(results_dir: Path, plan_file: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The plan under ``results_dir`` named by ``plan_file``, or why it cannot be shown (a path leaving
    the folder is refused)."""
    if not isinstance(plan_file, str) or not plan_file:
        return None, "The winner has no plan file."
    root = results_dir.resolve()
    path = (root / plan_file).resolve()
    if not path.is_relative_to(root):
        return None, f"The plan file {plan_file} lies outside the results folder; it is not read."
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return None, f"The plan file {plan_file} cannot be read: {error}"
    if not isinstance(plan, dict):
        return None, f"The plan file {plan_file} does not hold a plan (a JSON object)."
    return plan, None


def _section(name: str, title: str, content: str, caption: str) -> str:
    """A section of the page, ``name`` its id."""
    text = f'<p class="caption">{esc(caption)}</p>' if caption else ""
    return f'<section id="{name}"><h2>{esc(title)}</h2>{text}{content}</section>'


def _none(message: str) -> str:
    return f'<p class="note">{esc(message)}</p>'


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main>\n{body}\n"
        "<footer>Written by autoshard from the search's results.json (predictions of its cost model, "
        "not measurements).</footer>\n"
        f"</main><script>{SORT_SCRIPT}</script></body></html>\n"
    )
