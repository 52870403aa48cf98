"""The report's inline style sheet and its one small script (table sorting): no external resource."""

CSS = """
:root { --ink: #1f2933; --muted: #616e7c; --line: #d9e2ec; --paper: #ffffff; --wash: #f5f7fa;
  --good: #2f855a; --bad: #c53030; --warn: #b7791f; --accent: #4c72b0; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--wash); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 0 0 10px; }
h3 { font-size: 14px; margin: 18px 0 6px; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; }
section { background: var(--paper); border: 1px solid var(--line); border-radius: 8px; padding: 18px 20px;
  margin-top: 18px; }
.subtitle { color: var(--muted); margin: 0 0 14px; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(160px, 1fr)); gap: 8px; }
.fact { background: var(--wash); border-radius: 6px; padding: 8px 10px; }
.fact span { display: block; color: var(--muted); font-size: 12px; }
.fact b { font-size: 15px; }
table { border-collapse: collapse; width: 100%; }
.scroll { overflow-x: auto; }
th, td { padding: 5px 6px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; white-space: nowrap; }
.ranking th { cursor: pointer; user-select: none; }
.ranking th.sorted-asc::after { content: " \\25B2"; }
.ranking th.sorted-desc::after { content: " \\25BC"; }
td.nowrap { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.winner { background: #fff8e1; }
tr.row-failed, tr.row-infeasible { color: var(--muted); }
td.error { color: var(--bad); font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap;
  word-break: break-word; }
td.over { color: var(--bad); }
.badge { display: inline-block; padding: 1px 7px; border-radius: 10px; font-size: 12px; color: #fff; }
.badge.optimal { background: var(--good); }
.badge.feasible { background: var(--accent); }
.badge.infeasible { background: var(--warn); }
.badge.failed { background: var(--bad); }
.badge.other { background: var(--muted); }
.mem { display: flex; align-items: center; gap: 8px; white-space: nowrap; }
.mem .bar { width: 70px; height: 8px; background: var(--line); border-radius: 4px; overflow: hidden;
  flex: none; }
.mem .bar i { display: block; height: 100%; background: var(--accent); }
svg.plot { display: block; max-width: 100%; height: auto; margin: 6px auto; }
.caption, .note { color: var(--muted); font-size: 13px; }
.note { background: var(--wash); border-left: 3px solid var(--warn); padding: 6px 10px; }
.placements td.layers { font-family: ui-monospace, monospace; white-space: nowrap; }
.placements tr:not(.group-start) td { border-top: none; }
.placements tr.group-start td { border-top: 1px solid var(--line); }
.placements td, .collectives td { font-size: 13px; }
.spec { font-family: ui-monospace, monospace; }
.spec .shard { color: #2b6cb0; font-weight: 600; }
.spec .replicate { color: var(--muted); }
.spec .partial { color: #c05621; font-weight: 600; }
.collectives { width: auto; min-width: 280px; }
.columns { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 24px; }
@media (max-width: 900px) { .columns { grid-template-columns: 1fr; } }
footer { color: var(--muted); font-size: 12px; margin-top: 18px; }
"""

SORT_SCRIPT = """
(function () {
  var table = document.getElementById("ranking");
  if (!table) { return; }
  var body = table.tBodies[0];
  table.querySelectorAll("th[data-key]").forEach(function (th) {
    th.addEventListener("click", function () {
      var key = th.dataset.key, numeric = th.dataset.kind === "num";
      var ascending = !th.classList.contains("sorted-asc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
      th.classList.add(ascending ? "sorted-asc" : "sorted-desc");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.dataset[key], y = b.dataset[key];
        if (x === "" && y !== "") { return 1; }
        if (y === "" && x !== "") { return -1; }
        var order = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
})();
"""
