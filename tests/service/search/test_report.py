"""The search report over a real search's results: well-formed, self-contained, safe for any string, one
table row per candidate, the winner's plan summarised; and opened in real headless Chromium (Debian's
package, driven by Playwright): it loads with no console or page error and no request leaving the file,
every plot has drawn, the table has one row per candidate and sorts, the winner's summary is there.

``make test`` installs Chromium (``make chromium``); Playwright's own browser downloads are not used.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from playwright.sync_api import Page, sync_playwright

from service.plan_view import layer_ranges
from service.search.report.format import candidate_label, esc, size_text
from service.search.report.plan import LayerGroup, fold_layers
from service.search.report.render import render_report, write_report
from strategies.plan.planner import PlanRequest, plan_model
from tests.service.search.report_page import parse
from tests.service.search.report_results import HOSTILE_MODEL, build_results

Search = tuple[dict[str, Any], Path]


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> Search:
    """(results, results folder) of a real search (``mlp`` over 8 devices, each candidate planned), its
    ``report.html`` written beside ``results.json``."""
    folder = tmp_path_factory.mktemp("search")
    results = build_results(folder)
    write_report(folder)
    return results, folder


@pytest.fixture(scope="module")
def page(search: Search) -> str:
    return (search[1] / "report.html").read_text(encoding="utf-8")


def winner(results: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in results["candidates"] if c["rank"] == 1)


def test_the_search_has_every_kind_of_candidate(search: Search) -> None:
    statuses = {c["status"] for c in search[0]["candidates"]}
    assert {"infeasible", "failed"} <= statuses
    assert statuses & {"optimal", "feasible"}


def test_page_is_well_formed(page: str) -> None:
    parsed = parse(page)
    assert page.startswith("<!DOCTYPE html>")
    assert parsed.problems == []
    assert parsed.open == []
    for tag in ("html", "head", "title", "body", "main"):
        assert parsed.tags.count(tag) == 1, tag


def test_page_loads_nothing_from_outside(page: str) -> None:
    parsed = parse(page)
    assert "http://" not in page and "https://" not in page
    links = [value for _, name, value in parsed.attributes if name in ("src", "href")]
    assert links == [], "the plots are inline, and nothing else is linked"
    plots = "three plots: throughput against memory, step time, the winner's memory"
    assert parsed.tags.count("svg") == 3, plots
    assert not {"link", "iframe", "object", "embed", "img"} & set(parsed.tags)
    plot_links = [value for _, name, value in parsed.attributes if name == "xlink:href"]
    assert plot_links and all(value.startswith("#") for value in plot_links)  # markers inside the page


def test_markup_in_an_error_stays_text(page: str) -> None:
    assert HOSTILE_MODEL not in page
    assert esc(HOSTILE_MODEL) in page
    assert page.count("<script") == 1, "the page's own sorting script only"


def test_markup_anywhere_in_the_results_stays_text(search: Search) -> None:
    results, folder = search
    hostile = copy.deepcopy(results)
    evil = '"><img src=x onerror=alert(1)>&amp;'
    hostile["request"].update(model=evil, hardware=evil, executor=evil)
    for candidate in hostile["candidates"]:
        candidate["axis_names"] = [evil, "tp"]
        candidate["mesh"] = [r"$\frac{", "$"]  # broken math text, were plot labels parsed as math
        candidate["id"] += evil
        if candidate["status"] == "failed":
            candidate["error"] = evil
        if candidate["certificate"]:
            candidate["certificate"]["backend"] = evil
    rendered = render_report(hostile, folder)
    parsed = parse(rendered)
    assert evil not in rendered
    assert esc(evil) in rendered
    assert parsed.problems == []
    assert "onerror" not in {name for _, name, _ in parsed.attributes}
    assert parsed.tags.count("svg") == 3


def test_table_has_one_row_per_candidate_ranked_ones_first(page: str, search: Search) -> None:
    candidates = search[0]["candidates"]
    rows = parse(page).ranking_rows
    assert sorted(row["data-id"] for row in rows) == sorted(c["id"] for c in candidates)
    ranked = sorted(c["rank"] for c in candidates if c["rank"] is not None)
    assert [row["data-rank"] for row in rows] == [str(r) for r in ranked] + [""] * (len(rows) - len(ranked))


def test_infeasible_rows_show_the_smallest_peak_failed_rows_their_error(page: str, search: Search) -> None:
    text = parse(page).row_text
    for candidate in search[0]["candidates"]:
        if candidate["status"] == "infeasible":
            assert size_text(candidate["min_peak_bytes"]) in text[candidate["id"]]
        if candidate["status"] == "failed":
            assert candidate["error"] in text[candidate["id"]]


def test_header_counts_the_candidates(page: str, search: Search) -> None:
    candidates = search[0]["candidates"]
    for label, status in (("infeasible", "infeasible"), ("failed", "failed")):
        count = sum(c["status"] == status for c in candidates)
        assert f"<span>{label}</span><b>{count}</b>" in page
    assert f"<span>candidates</span><b>{len(candidates)}</b>" in page


def test_header_says_whether_the_top_row_is_proven_best(page: str, search: Search) -> None:
    from service.search.pruning import proof_text, top_row_proof
    from service.search.report.format import esc

    proof = top_row_proof(search[0]["candidates"])
    assert proof is not None and proof["top"] == search[0]["candidates"][0]["id"]
    assert f"<span>the top row</span><b>{esc(proof_text(proof))}</b>" in page


def test_the_time_limit_line_shows_what_a_budget_gave_each_plan() -> None:
    from service.search.report.render import _time_limits

    budgeted = {"time_limit_s": 60.0, "budget_s": 60.0}
    given = [{"time_limit_s": 2.25}, {"time_limit_s": 0.5}, {"time_limit_s": None}]
    assert _time_limits(budgeted, given) == "0.5-2.25 s from the budget (at most 60 s)"
    assert _time_limits(budgeted, [{"time_limit_s": 0.5}]) == "500 ms from the budget (at most 60 s)"
    assert _time_limits({"time_limit_s": 3.0}, [{"time_limit_s": 3.0}]) == "3 s"


def test_winner_summary_shows_its_plan(page: str, search: Search) -> None:
    results, folder = search
    best = winner(results)
    plan = json.loads((folder / best["plan_file"]).read_text())
    summary = page[page.index('<section id="winner">') :]
    assert best["id"] in summary
    for name, spec in plan["parameters"].items():
        assert esc(name) in summary
        assert all(entry in summary for entry in spec)
    for kind, count in plan["predicted"]["collectives"].items():
        assert f'<td>{kind}</td><td class="num">{count:,}</td>' in summary
    assert "Memory over the step" in summary
    assert "no memory profile" not in summary


def test_a_plan_without_a_memory_profile_says_so(search: Search, tmp_path: Path) -> None:
    results, folder = search
    shutil.copytree(folder / "plans", tmp_path / "plans")
    path = tmp_path / winner(results)["plan_file"]
    plan = json.loads(path.read_text())
    del plan["predicted"]["memory_profile"]
    path.write_text(json.dumps(plan))
    rendered = render_report(results, tmp_path)
    assert "This plan has no memory profile" in rendered
    assert size_text(plan["predicted"]["peak_memory_bytes"]) in rendered
    assert parse(rendered).tags.count("svg") == 2


def test_a_plan_file_outside_the_results_folder_is_not_read(search: Search) -> None:
    results = copy.deepcopy(search[0])
    winner(results)["plan_file"] = "../../etc/passwd"
    rendered = render_report(results, search[1])
    assert "lies outside the results folder" in rendered


def test_results_of_another_kind_are_refused_naming_the_field(search: Search) -> None:
    with pytest.raises(ValueError, match=r"^format:"):
        render_report({**search[0], "format": "autoshard.plan"}, search[1])
    with pytest.raises(ValueError, match=r"^candidates:"):
        render_report({**search[0], "candidates": "none"}, search[1])


def test_a_search_without_any_plan_still_reads(search: Search) -> None:
    results = copy.deepcopy(search[0])
    results["candidates"] = [c for c in results["candidates"] if c["status"] == "failed"]
    results["pareto"] = []
    rendered = render_report(results, search[1])
    parsed = parse(rendered)
    assert parsed.problems == []
    assert len(parsed.ranking_rows) == len(results["candidates"]) > 0
    assert "No candidate has a plan: there is no winner." in rendered
    assert "svg" not in parsed.tags
    empty = render_report({**results, "candidates": []}, search[1])
    assert parse(empty).ranking_rows == []
    assert "<span>candidates</span><b>0</b>" in empty


def test_layers_with_the_same_placements_fold_into_ranges() -> None:
    parameters = {"embed.weight": ["S(0)"]}
    for layer in range(6):
        spec = ["R"] if layer in (0, 5) else ["S(1)"]
        parameters |= {f"layers.{layer}.attn.wq.weight": spec, f"layers.{layer}.mlp.w1.weight": ["S(0)"]}
    parameters["norm.weight"] = ["R"]
    rows = fold_layers(parameters)
    assert rows[0] == ("embed.weight", "[S(0)]")
    assert rows[-1] == ("norm.weight", "[R]")
    groups = rows[1:-1]
    assert [(g.stack, layer_ranges(g.layers, "–", ", ")) for g in groups if isinstance(g, LayerGroup)] == [
        ("layers.", "0, 5"),
        ("layers.", "1–4"),
    ]
    assert groups[1].pattern == (("attn.wq.weight", "[S(1)]"), ("mlp.w1.weight", "[S(0)]"))


def test_a_real_language_model_plan_folds_its_tied_middle_layers() -> None:
    outcome = plan_model(
        PlanRequest(
            model="gpt2-small",
            mesh="2x2",
            batch=8,
            seq=128,
            layers=6,
            time_limit=10,
            options={"dim": 128, "n_heads": 4, "vocab_size": 1024},
        )
    )
    groups = [row for row in fold_layers(outcome.plan["parameters"]) if isinstance(row, LayerGroup)]
    layers = sorted(layer for group in groups for layer in group.layers)
    assert layers == list(range(6))
    assert any({1, 2, 3, 4} <= set(group.layers) for group in groups), "the tied middle layers fold"
    per_layer = sum(name.startswith("layers.0.") for name in outcome.plan["parameters"])
    assert all(len(group.pattern) == per_layer for group in groups)


# ------------------------------------------------------------------------- in headless Chromium

CHROMIUM = "chromium"


@dataclass
class OpenedReport:
    page: Page
    errors: list[str] = field(default_factory=list)
    """Console errors and uncaught page errors."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page asked for."""


@pytest.fixture(scope="module")
def opened(search: Search) -> Iterator[OpenedReport]:
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


TEXTS = """svg => Array.from(svg.querySelectorAll("text")).map(text => {
  const box = text.getBoundingClientRect();
  const axis = ["x", "y"].find(name => text.closest(`[id*="${name}tick_"]`) !== null);
  const tick = axis === undefined ? "" : axis;
  return [text.textContent, tick, box.left, box.top, box.right, box.bottom];
})"""
"""Every text the browser drew in a plot: its content, ``x``/``y`` for an axis's tick label, its box."""
NUMBER = re.compile(r"^-?[0-9][0-9.,]*( ?[kMG])?$")


def test_the_plots_axes_read_as_numbers_and_its_labels_do_not_overlap(
    opened: OpenedReport, search: Search
) -> None:
    texts = opened.page.locator("svg#throughput-memory").evaluate(TEXTS)
    ticks = [t for t in texts if t[1]]
    assert {t[1] for t in ticks} == {"x", "y"}
    assert all(NUMBER.match(t[0]) for t in ticks), [t[0] for t in ticks]
    assert not any("$" in t[0] or "mathdefault" in t[0] for t in texts)
    labels = {candidate_label(c) for c in search[0]["candidates"] if c["id"] in search[0]["pareto"]}
    boxes = [t[2:] for t in texts if t[0] in labels and not t[1]]
    assert len(boxes) >= len(labels) > 1
    for k, (left, top, right, bottom) in enumerate(boxes):
        for other in boxes[k + 1 :]:
            apart = right <= other[0] or other[2] <= left or bottom <= other[1] or other[3] <= top
            assert apart, (boxes, labels)


def test_table_has_one_row_per_candidate(opened: OpenedReport, search: Search) -> None:
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


def test_winner_summary_is_there(opened: OpenedReport, search: Search) -> None:
    best = next(c for c in search[0]["candidates"] if c["rank"] == 1)
    section = opened.page.locator("section#winner")
    assert section.locator("h2").inner_text().startswith("The winner")
    text = section.inner_text()
    assert best["id"] in text
    assert "PLACEMENTS BY LAYER" in text.upper() and "COLLECTIVES PER STEP" in text.upper()
    assert section.locator("table.placements tbody tr").count() >= 1
    assert section.locator("svg.plot").evaluate("svg => svg.getBoundingClientRect().width") > 0


def test_a_log_memory_axis_is_labelled_with_plain_numbers() -> None:
    """Peaks 100x apart put the memory axis on a log scale, whose default labels are math text
    (``$\\mathdefault{10^{0}}$``) that the report, with math text off, would print raw."""
    from service.search.report.plots import throughput_memory_plot

    def candidate(name: str, peak_gib: float, rate: float) -> dict[str, Any]:
        return {
            "id": name,
            "status": "feasible",
            "rank": 1 if name == "a" else 2,
            "peak_memory_bytes": peak_gib * 2**30,
            "tokens_per_s": rate,
            "mesh": [8],
            "axis_names": ["dp"],
            "batch": 16,
        }

    svg = throughput_memory_plot([candidate("a", 0.5, 900.0), candidate("b", 60.0, 1000.0)], ["a", "b"])
    assert svg is not None and svg.startswith("<svg")
    tree = ElementTree.fromstring(svg.replace("xlink:href", "href"))  # inline SVG: no namespace declared
    groups = [g for g in tree.iter("g") if "-xtick_" in g.get("id", "")]
    ticks = [text.text for g in groups for text in g.iter("text")]
    assert ticks and all(NUMBER.match(tick) for tick in ticks), ticks
    assert "1" in ticks and "10" in ticks
    assert "mathdefault" not in svg and "$" not in svg
