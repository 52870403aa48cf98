"""What ``autoshard search`` shows: the candidate count, a progress bar with done / infeasible / pruned /
failed counts and the best so far (rich, on stderr), and the ranking table at the end."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.search.results import has_plan
from service.search.task import UNPLANNED


class SearchProgress:
    """A rich progress bar fed by the runner (a :class:`~service.search.runner.SearchListener`)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]search"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[best]}"),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.counts = {"planned": 0, **dict.fromkeys(UNPLANNED, 0)}
        self.best: dict[str, Any] | None = None

    def started(self, total: int, reused: int) -> None:
        reuse = f" ({reused} from the plan cache)" if reused else ""
        self.console.print(f"autoshard search: {total} candidates{reuse}")
        self.task = self.progress.add_task("search", total=total, counts=self._counts(), best="")
        self.progress.start()

    def finished(self, row: dict[str, Any]) -> None:
        if has_plan(row):
            self.counts["planned"] += 1
            if self.best is None or row["samples_per_s"] > self.best["samples_per_s"]:
                self.best = row
        elif row["status"] in self.counts:
            self.counts[row["status"]] += 1
        best = "" if self.best is None else f"best {candidate_label(self.best)} {throughput_text(self.best)}"
        self.progress.update(self.task, advance=1, counts=self._counts(), best=best)

    def stop(self) -> None:
        self.progress.stop()

    def _counts(self) -> str:
        return " · ".join(f"{status} {count}" for status, count in self.counts.items())


def candidate_label(row: dict[str, Any]) -> str:
    mesh = "x".join(str(size) for size in row["mesh"])
    return f"{row['id']} {mesh} ({','.join(row['axis_names'])}) batch {row['batch']}"


def throughput_text(row: dict[str, Any]) -> str:
    if row["tokens_per_s"] is not None:
        return f"{row['tokens_per_s']:,.0f} tokens/s"
    return f"{row['samples_per_s']:,.1f} samples/s"


def ranking_table(results: dict[str, Any], top: int = 10) -> Table:
    """The ranked candidates (top ``top``) and a line per status, as a rich table."""
    tokens = any(row["tokens_per_s"] is not None for row in results["candidates"])
    table = Table(
        title=f"autoshard search: {len(results['candidates'])} candidates in {results['wall_s']:.1f} s"
    )
    for name in ("rank", "id", "mesh", "axes", "batch", "step (s)", "tokens/s" if tokens else "samples/s",
                 "peak (GiB)", "compute (s)", "recompute (s)", "exposed comm (s)", "status",
                 "gap"):  # fmt: skip
        table.add_column(name, justify="left" if name in ("id", "mesh", "axes", "status") else "right")
    for row in results["candidates"][:top]:
        if row["rank"] is None:
            break
        throughput = row["tokens_per_s"] if tokens else row["samples_per_s"]
        gap = row["certificate"]["gap"]
        table.add_row(
            str(row["rank"]),
            row["id"],
            "x".join(str(size) for size in row["mesh"]),
            ",".join(row["axis_names"]),
            str(row["batch"]),
            f"{row['step_time_s']:.4g}",
            f"{throughput:,.0f}" if tokens else f"{throughput:,.1f}",
            f"{row['peak_memory_bytes'] / 2**30:.1f}",
            f"{row['compute_s']:.4g}",
            f"{row.get('recompute_s') or 0.0:.4g} ({row.get('recomputed') or 0} values)",
            f"{row['exposed_comm_s']:.4g}",
            row["status"],
            "-" if gap is None else f"{gap:.2%}",
        )
    return table


def status_counts(results: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in results["candidates"]:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts
