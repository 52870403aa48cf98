"""The search report opened in real headless Chromium (Debian's package, driven by Playwright): it loads
with no console or page error and no request leaving the file, every plot has drawn, the table has one row
per candidate and sorts, the winner's summary is there.

``make test`` installs Chromium (``make chromium``); Playwright's own browser downloads are not used.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

CHROMIUM = "chromium"


@dataclass
class OpenedReport:
    page: Page
    errors: list[str] = field(default_factory=list)
    """Console errors and uncaught page errors."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page asked for."""


@pytest.fixture(scope="module")
def opened(search: tuple[dict[str, Any], Path]) -> Iterator[OpenedReport]:
    executable = shutil.which(CHROMIUM)
    if executable is None:
        pytest.fail("Chromium is not installed: run `make chromium` (Debian's chromium package)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        report = OpenedReport(page)
        page.on("console", lambda m: report.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda error: report.errors.append(str(error)))
        page.on("request", lambda request: report.requests.append(request.url))
        page.goto((search[1] / "report.html").as_uri(), wait_until="load")
        yield report
        browser.close()


def test_page_loads_without_errors_or_outside_requests(opened: OpenedReport) -> None:
    assert opened.errors == []
    assert all(url.startswith(("file://", "data:")) for url in opened.requests), opened.requests
    assert opened.page.title() == "autoshard search: mlp"


DRAWN = """plots => Promise.all(plots.map(async (plot) => {
  if (plot.tagName.toLowerCase() === "svg") {
    const box = plot.getBBox();
    return [box.width, box.height, box.width * box.height];
  }
  try { await plot.decode(); } catch (error) { return [0, 0, 0]; }
  const canvas = document.createElement("canvas");
  canvas.width = plot.naturalWidth;
  canvas.height = plot.naturalHeight;
  const context = canvas.getContext("2d");
  context.drawImage(plot, 0, 0);
  const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  for (let k = 0; k < pixels.length; k += 4) {
    if (pixels[k + 3] > 0 && pixels[k] + pixels[k + 1] + pixels[k + 2] < 600) { inked += 1; }
  }
  return [plot.naturalWidth, plot.naturalHeight, inked];
}))"""
"""Per plot: its natural width and height once decoded (0 when it cannot be decoded) and how many of its
pixels are ink (not white, not transparent)."""


def test_every_plot_has_drawn(opened: OpenedReport) -> None:
    drawn = opened.page.eval_on_selector_all("main img, main svg", DRAWN)
    assert len(drawn) == 3, "throughput against memory, step time, the winner's memory"
    assert all(width > 0 and height > 0 and inked > 1000 for width, height, inked in drawn), drawn


def test_table_has_one_row_per_candidate(opened: OpenedReport, search: tuple[dict[str, Any], Path]) -> None:
    ids = opened.page.eval_on_selector_all("#ranking tbody tr", "rows => rows.map(r => r.dataset.id)")
    assert sorted(ids) == sorted(c["id"] for c in search[0]["candidates"])


def test_clicking_a_column_sorts_the_table(opened: OpenedReport) -> None:
    page = opened.page
    header = page.locator('#ranking th[data-key="batch"]')
    batches = "rows => rows.map(r => Number(r.dataset.batch))"
    header.click()
    ascending = page.eval_on_selector_all("#ranking tbody tr", batches)
    header.click()
    descending = page.eval_on_selector_all("#ranking tbody tr", batches)
    assert ascending == sorted(ascending) and len(set(ascending)) > 1
    assert descending == sorted(ascending, reverse=True)
    page.locator('#ranking th[data-key="rank"]').click()
    ranks = page.eval_on_selector_all("#ranking tbody tr", "rows => rows.map(r => r.dataset.rank)")
    assert ranks[0] == "1"
    assert opened.errors == []


def test_winner_summary_is_there(opened: OpenedReport, search: tuple[dict[str, Any], Path]) -> None:
    best = next(c for c in search[0]["candidates"] if c["rank"] == 1)
    section = opened.page.locator("section#winner")
    assert section.locator("h2").inner_text().startswith("The winner")
    text = section.inner_text()
    assert best["id"] in text
    assert "PLACEMENTS BY LAYER" in text.upper() and "COLLECTIVES PER STEP" in text.upper()
    assert section.locator("table.placements tbody tr").count() >= 1
    assert section.locator("img.plot").evaluate("img => img.naturalWidth") > 0
