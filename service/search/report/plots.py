"""The report's figures, drawn with matplotlib and embedded in the page as inline SVG.

No pyplot (no global figure state: the service renders reports in worker threads) and no math text (a ``$`` in
a label stays a dollar sign; tick labels are plain numbers, so a log axis reads 1, 10, 100 rather than the
mathtext its default formatter writes). Text stays text in the SVG (``svg.fonttype: none``): the browser
draws it with the page's fonts, and it can be read, searched and checked.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from service.search.report.format import candidate_label, esc, number, rate_text, throughput, throughput_unit

GIB = 2**30
MAX_BARS = 30
"""Candidates drawn in the time breakdown (the best ones); the table lists them all."""

COMPUTE, COMM, CONTENTION, LOAD = "#4c72b0", "#dd8452", "#e8b98f", "#8c8c8c"
FEASIBLE, PARETO, INFEASIBLE, BUDGET = "#7f9fc6", "#c44e52", "#937860", "#55a868"
STYLE = {
    "text.parse_math": False,
    "svg.fonttype": "none",
    "svg.hashsalt": "autoshard",  # the same ids for the same figure: a report renders the same bytes
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


_STYLE_LOCK = threading.Lock()


@contextmanager
def styled() -> Iterator[None]:
    """The report's plot style while a figure is drawn and saved. matplotlib's settings are global, so one
    figure is drawn at a time (a service may render reports in several threads)."""
    with _STYLE_LOCK, rc_context(STYLE):
        yield


def figure_svg(figure: Figure, alt: str, name: str) -> str:
    """``figure`` as an inline ``<svg>`` element (no XML prolog), labelled ``alt`` for screen readers, its
    element ids prefixed with ``name`` (several figures share one page, and one id space)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]
    # inline in HTML: the parser gives <svg> its namespace; the namespace URLs and the RDF metadata go
    svg = re.sub(r' xmlns(:xlink)?="[^"]*"', "", svg, count=2)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, count=1, flags=re.DOTALL)
    svg = re.sub(r'(\bid="|url\(#|href="#)', rf"\g<1>{name}-", svg)
    opening = svg.index(">")
    attributes = f' class="plot" id="{name}" role="img" aria-label="{esc(alt)}"'
    return f"{svg[:opening]}{attributes}{svg[opening:]}"


def new_figure(width: float, height: float) -> Figure:
    """A figure (inches) on its own SVG canvas, whatever matplotlib's default backend is."""
    figure = Figure(figsize=(width, height))
    FigureCanvasSVG(figure)
    return figure


def throughput_memory_plot(candidates: list[dict[str, Any]], pareto: Sequence[str]) -> str | None:
    """Predicted throughput against peak memory per device: every feasible candidate, the Pareto front
    joined up, the winner starred, infeasible candidates on the floor at the smallest peak they could reach,
    the memory budget as a vertical line. None when no candidate has numbers to draw."""
    feasible = [c for c in candidates if _point(c) is not None]
    floor = [
        peak
        for c in candidates
        if c.get("status") == "infeasible" and (peak := number(c.get("min_peak_bytes"))) is not None
    ]
    if not feasible and not floor:
        return None
    budgets = sorted({b for c in candidates if (b := number(c.get("memory_budget_bytes"))) is not None})
    sizes = [p[0] for c in feasible if (p := _point(c))] + floor + budgets
    scale, size_unit = memory_unit(max(sizes))
    unit = throughput_unit(candidates)
    with styled():
        figure = new_figure(7.5, 4.2)
        axes = figure.add_subplot()
        front = [c for c in feasible if c.get("id") in set(pareto)]
        _scatter(axes, [c for c in feasible if c not in front], scale, FEASIBLE, "o", "feasible", size=28)
        labelled = _draw_front(axes, front, scale)
        winner = [c for c in feasible if c.get("rank") == 1]
        _scatter(axes, winner, scale, "#f2c12e", "*", "winner (rank 1)", size=180, edge="#333333")
        if floor:
            label = "infeasible: smallest reachable peak"
            xs = [peak / scale for peak in floor]
            axes.scatter(xs, [0.0] * len(xs), marker="x", s=50, color=INFEASIBLE, clip_on=False, label=label)
        for k, budget in enumerate(budgets):
            label = "memory budget" if k == 0 else None
            axes.axvline(budget / scale, color=BUDGET, linestyle="--", linewidth=1.2, label=label)
        if min(sizes) > 0 and max(sizes) / min(sizes) > 30:
            axes.set_xscale("log")
            axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_ylim(bottom=0)
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: rate_text(value)))
        axes.set_xlabel(f"peak memory per device ({size_unit})")
        axes.set_ylabel(f"predicted throughput ({unit})")
        axes.legend(loc="best", fontsize=8, framealpha=0.9)
        # labels last: their boxes are measured on the axes as drawn (scale and limits final)
        axes.set_xlim(axes.get_xlim())
        axes.set_ylim(axes.get_ylim())
        _label_points(axes, labelled)
        alt = f"predicted throughput ({unit}) against peak memory per device"
        return figure_svg(figure, alt, "throughput-memory")


def _draw_front(axes: Axes, front: list[dict[str, Any]], scale: float) -> list[tuple[float, float, str]]:
    """The Pareto front as a staircase through its points (by memory); the points to label."""
    points = sorted((p, c) for c in front if (p := _point(c)) is not None)
    if not points:
        return []
    xs = [p[0] / scale for p, _ in points]
    ys = [p[1] for p, _ in points]
    axes.plot(xs, ys, color=PARETO, linewidth=1, zorder=2, drawstyle="steps-post", alpha=0.6)
    _scatter(axes, [c for _, c in points], scale, PARETO, "o", "Pareto front", size=40)
    return [(x, y, candidate_label(c)) for x, y, (_, c) in zip(xs, ys, points, strict=True)]


LABEL_OFFSETS = [(6, 4), (6, -12), (-6, 4), (-6, -12), (6, 16), (-6, 16), (6, -24), (-6, -24)]
"""Where a point's label may go (points right and up of the point; negative x: the label ends there)."""
LABEL_ROOM = (1.15, 1.4)
"""A label's box widened and heightened by these factors when checked against the labels placed before it."""


def _label_points(axes: Axes, points: list[tuple[float, float, str]]) -> None:
    """Label each point at the first offset where its text overlaps no label placed before it (else at
    the last offset tried): close points stay readable. The axes' scale and limits must be final: the boxes
    are measured where the labels will be drawn."""
    placed: list[Any] = []
    for x, y, text in points:
        for k, (dx, dy) in enumerate(LABEL_OFFSETS):
            label = axes.annotate(
                text,
                (x, y),
                textcoords="offset points",
                xytext=(dx, dy),
                fontsize=8,
                ha="left" if dx > 0 else "right",
            )
            # room around each label: the browser draws the SVG's text in its own fonts, not quite the
            # size matplotlib measured
            box = label.get_window_extent().expanded(*LABEL_ROOM)
            if not any(box.overlaps(other) for other in placed) or k == len(LABEL_OFFSETS) - 1:
                placed.append(box)
                break
            label.remove()


def memory_unit(largest: float) -> tuple[float, str]:
    """(bytes per unit, unit) to draw sizes up to ``largest`` in: GiB from 1 GiB on, else MiB."""
    return (GIB, "GiB") if largest >= GIB else (2**20, "MiB")


def time_breakdown_plot(ranked: list[dict[str, Any]]) -> str | None:
    """Stacked horizontal bars of compute, exposed communication, compute slowed by the hidden collectives
    and input loading per ranked candidate, the best at the top. None when no candidate is ranked."""
    rows = [c for c in ranked if number(c.get("step_time_s")) is not None][:MAX_BARS]
    if not rows:
        return None
    parts = [
        ("compute", "compute_s", COMPUTE),
        ("exposed communication", "exposed_comm_s", COMM),
        ("compute slowed by collectives", "contention_s", CONTENTION),
        ("input loading", "load_s", LOAD),
    ]
    scale, unit = _time_unit(max(number(c["step_time_s"]) or 0.0 for c in rows))
    labels = [f"#{c.get('rank')}  {candidate_label(c)}" for c in rows]
    positions = list(range(len(rows)))
    with styled():
        figure = new_figure(7.5, 1.2 + 0.28 * len(rows))
        axes = figure.add_subplot()
        left = [0.0] * len(rows)
        for name, key, color in parts:
            widths = [(number(c.get(key)) or 0.0) / scale for c in rows]
            axes.barh(positions, widths, left=left, color=color, label=name, height=0.7)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        axes.set_yticks(positions, labels)
        axes.invert_yaxis()
        axes.grid(axis="y", visible=False)
        axes.set_xlabel(f"predicted step time ({unit})")
        axes.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
        alt = "predicted step time per candidate: compute, exposed communication, loading"
        return figure_svg(figure, alt, "step-time")


def memory_profile_plot(profile: dict[str, Any], budget_bytes: float | None) -> str | None:
    """Live bytes per device over the step, the peak marked; the budget as a line when it is within sight
    of the curve (else named in the title: a line far above would flatten the curve). None when the profile
    holds no points."""
    positions = [number(p) for p in profile.get("positions") or []]
    sizes = [number(b) for b in profile.get("bytes") or []]
    points = [(p, b) for p, b in zip(positions, sizes, strict=False) if p is not None and b is not None]
    if not points:
        return None
    xs, ys = zip(*points, strict=True)
    peak = max(ys)
    scale, unit = memory_unit(max(peak, budget_bytes or 0))
    with styled():
        figure = new_figure(7.5, 3.0)
        axes = figure.add_subplot()
        axes.fill_between(xs, [y / scale for y in ys], step="post", color=COMPUTE, alpha=0.25)
        axes.plot(
            xs,
            [y / scale for y in ys],
            drawstyle="steps-post",
            color=COMPUTE,
            linewidth=1.2,
            label="live bytes per device",
        )
        at = xs[ys.index(peak)]
        axes.plot([at], [peak / scale], "v", color=PARETO, label=f"peak {peak / scale:.3g} {unit}")
        title = ""
        if budget_bytes is not None and budget_bytes <= 3 * peak:
            axes.axhline(budget_bytes / scale, color=BUDGET, linestyle="--", label="memory budget")
        elif budget_bytes is not None:
            title += (
                f" (budget {budget_bytes / scale:.3g} {unit}, {budget_bytes / peak:.0f}x the peak, above)"
            )
        axes.set_ylim(bottom=0)
        if title:
            axes.set_title(title, fontsize=9)
        axes.set_xlabel("position in the step (graph order: forward, then backward)")
        axes.set_ylabel(f"live memory per device ({unit})")
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3, fontsize=8, frameon=False)
        return figure_svg(figure, "live memory per device over the step", "memory-profile")


def _point(candidate: dict[str, Any]) -> tuple[float, float] | None:
    """(peak bytes, throughput) of a candidate that has a plan, else None."""
    if candidate.get("status") not in ("optimal", "feasible"):
        return None
    peak, rate = number(candidate.get("peak_memory_bytes")), throughput(candidate)
    return None if peak is None or rate is None else (peak, rate)


def _scatter(
    axes: Axes,
    candidates: list[dict[str, Any]],
    scale: float,
    color: str,
    marker: str,
    label: str,
    size: float,
    edge: str = "white",
) -> None:
    points = [p for c in candidates if (p := _point(c)) is not None]
    if points:
        xs, ys = [p[0] / scale for p in points], [p[1] for p in points]
        axes.scatter(
            xs, ys, s=size, color=color, marker=marker, edgecolors=edge, linewidths=0.6, zorder=3, label=label
        )


def _time_unit(longest: float) -> tuple[float, str]:
    for scale, unit in ((1.0, "s"), (1e-3, "ms")):
        if longest >= scale:
            return scale, unit
    return 1e-6, "µs"
