"""The search's HTML report, when the report package (:mod:`service.search.report`, matplotlib) is there:
imported only when a page is written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def report_renderer() -> Callable[[dict[str, Any], Path], str] | None:
    """``render_report(results, results_dir) -> html``, or None when the module is not there."""
    try:
        from service.search.report.render import render_report  # type: ignore[import-not-found]
    except ImportError:
        return None
    return render_report


def write_report(results: dict[str, Any], out: Path) -> Path | None:
    """``out/report.html`` from the results and the plans under ``out``; None without the report module."""
    render = report_renderer()
    if render is None:
        return None
    path = out / "report.html"
    path.write_text(render(results, out), encoding="utf-8")
    return path
