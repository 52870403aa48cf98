"""Side by side with the contest winner: autoshard and the winner's binary on the same instance, same limits.

For each instance, one after the other in the same run: ``autoshard solve FILE --backend auto`` in a fresh
process, then the ASPLOS 2025 IOPDDL winner's solver (ti2-group/iopddl_experiments, built beside the
repository: ``iopddl FILE.json LIMIT -j THREADS``), each with the same time limit and the same threads. Both
answers are re-evaluated here by `solver.evaluate` (strategy ranges, forbidden costs, the memory limit): a
solution that breaks one is reported as infeasible, never as a cost.

    ratio = autoshard cost / winner cost        geometric mean = exp(mean(log ratio)) over the rows with both

The winner prints ``# Cost: <cost> (<who>) <seconds> s (iteration: <i>)`` and, unless ``-q``, the assignment
as ``[s0, s1, ...]`` on the next line, each time its incumbent improves; its answer is the last assignment
printed (``(pid: *)`` marks a proven optimum, after which it exits before its limit). It reads plain JSON
only, so a ``.json.gz`` instance is unpacked into a private temp directory first (outside its timed run),
and it runs there (it writes a weights file where it runs).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from solver.errors import ProblemError
from solver.evaluate import evaluate
from solver.problem import Problem

WINNER_VARIABLE = "AUTOSHARD_IOPDDL_WINNER"
REPO = Path(__file__).resolve().parents[1]
#: A run is killed when it outlives its limit by this share plus this many seconds (both exit on time).
KILL_SHARE, KILL_GRACE_S = 0.5, 30.0
COLUMNS = (
    "instance",
    "nodes",
    "autoshard cost",
    "winner cost",
    "autoshard / winner",
    "autoshard bound",
    "autoshard gap",
    "autoshard s",
    "winner s",
    "notes",
)
_COST_LINE = re.compile(r"^# Cost: (\S+)")


@dataclass(frozen=True)
class WinnerOutput:
    """What the winner's standard output says: its last assignment (None when it printed none or ``[]``)
    and the cost it printed with it."""

    solution: list[int] | None
    reported_cost: float | None


@dataclass(frozen=True)
class Checked:
    """A solution judged by autoshard's evaluator: its cost when feasible, else why not."""

    cost: float | None
    problem: str | None = None

    @property
    def feasible(self) -> bool:
        return self.cost is not None


def parse_winner_output(text: str) -> WinnerOutput:
    """The winner's answer: the last ``[...]`` line after a ``# Cost:`` line."""
    solution, reported = None, None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = _COST_LINE.match(line)
        if match is None or i + 1 >= len(lines) or not lines[i + 1].startswith("["):
            continue
        vector = json.loads(lines[i + 1])
        solution = [int(s) for s in vector] or None
        reported = float(match.group(1))
    return WinnerOutput(solution=solution, reported_cost=reported)


def check_solution(problem: Problem, solution: Sequence[int] | None) -> Checked:
    """Cost of a solution by `solver.evaluate`, or why it is not one (missing, out of range, infeasible)."""
    if solution is None:
        return Checked(cost=None, problem="no solution")
    try:
        evaluation = evaluate(problem, list(solution))
    except ProblemError as error:
        return Checked(cost=None, problem=f"invalid: {error}")
    if not evaluation.feasible:
        return Checked(cost=None, problem="infeasible: " + "; ".join(evaluation.violations))
    return Checked(cost=evaluation.cost)


def read_solution_file(path: Path) -> list[int] | None:
    """An assignment from a file: autoshard's result JSON (its ``solution``) or a bare JSON list."""
    document = json.loads(path.read_text())
    solution = document.get("solution") if isinstance(document, dict) else document
    return None if solution is None else [int(s) for s in solution]


def _kill_after(limit: float) -> float:
    return limit * (1 + KILL_SHARE) + KILL_GRACE_S


def run_autoshard(path: Path, limit: float, threads: int, workdir: Path) -> dict:
    """``autoshard solve`` in a fresh process; its result JSON with ``wall`` (seconds, start to exit)."""
    out = workdir / "autoshard.json"
    command = [
        _autoshard_command(),
        "solve",
        str(path),
        "--backend",
        "auto",
        "--time-limit",
        f"{limit:g}",
        "--threads",
        str(threads),
        "--out",
        str(out),
        "--quiet",
    ]
    # The checkout this module is in comes first on the path: the environment's `autoshard` would otherwise
    # import the package it was installed from (an editable install of another worktree).
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_kill_after(limit), env=env)
    except subprocess.TimeoutExpired:
        return {"status": "killed", "wall": time.perf_counter() - started}
    wall = time.perf_counter() - started
    if not out.is_file():
        return {"status": f"exit {done.returncode}: {done.stderr.strip()[-300:]}", "wall": wall}
    return {**json.loads(out.read_text()), "wall": wall}


def _autoshard_command() -> str:
    beside = Path(sys.executable).parent / "autoshard"
    return str(beside) if beside.is_file() else (shutil.which("autoshard") or "autoshard")


def run_winner(binary: Path, path: Path, limit: float, threads: int, workdir: Path) -> dict:
    """The winner's binary on the instance (unpacked to plain JSON first); its answer, cost and wall time."""
    plain = workdir / path.name.removesuffix(".gz")
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as packed, plain.open("wb") as unpacked:
            shutil.copyfileobj(packed, unpacked)
    else:
        shutil.copyfile(path, plain)
    log = workdir / "winner.out"
    command = [str(binary), str(plain), f"{limit:g}", "-j", str(threads)]
    started = time.perf_counter()
    with log.open("w") as stdout:
        try:
            done = subprocess.run(
                command,
                cwd=workdir,  # it writes <instance>_nodes_1_best_weights.bin where it runs
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                timeout=_kill_after(limit),
            )
            status = (
                "done" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
            )
        except subprocess.TimeoutExpired:
            status = "killed"
    wall = time.perf_counter() - started
    output = parse_winner_output(log.read_text())
    return {
        "status": status,
        "solution": output.solution,
        "reported_cost": output.reported_cost,
        "wall": wall,
    }


def compare(instance: str, problem: Problem, autoshard: dict, winner: dict) -> dict:
    """One row: both answers re-evaluated, the ratio when both are feasible, autoshard's bound and gap."""
    ours = check_solution(problem, autoshard.get("solution"))
    theirs = check_solution(problem, winner.get("solution"))
    notes = []
    if not ours.feasible:
        notes.append(f"autoshard ({autoshard.get('status')}): {ours.problem}")
    elif autoshard.get("cost") is not None and not math.isclose(autoshard["cost"], ours.cost, rel_tol=1e-9):
        notes.append(f"autoshard reported {autoshard['cost']:,.0f}")
    if not theirs.feasible:
        notes.append(f"winner ({winner.get('status')}): {theirs.problem}")
    return {
        "instance": instance,
        "nodes": problem.num_nodes,
        "autoshard_cost": ours.cost,
        "winner_cost": theirs.cost,
        "ratio": ours.cost / theirs.cost if ours.feasible and theirs.feasible and theirs.cost else None,
        "autoshard_status": autoshard.get("status"),
        "autoshard_backend": autoshard.get("backend"),
        "bound": autoshard.get("bound"),
        "gap": autoshard.get("gap"),
        "autoshard_seconds": autoshard.get("seconds"),
        "autoshard_wall": autoshard.get("wall"),
        "winner_wall": winner.get("wall"),
        "winner_reported_cost": winner.get("reported_cost"),
        "notes": "; ".join(notes),
    }


def side_by_side(
    instance: str, path: Path, problem: Problem, binary: Path, limit: float, threads: int
) -> dict:
    """Run autoshard, then the winner, on one instance in a private temp directory; compare."""
    with tempfile.TemporaryDirectory(prefix=f"iopddl-{instance}-") as scratch:
        workdir = Path(scratch)
        autoshard = run_autoshard(path, limit, threads, workdir)
        winner = run_winner(binary, path, limit, threads, workdir)
    return compare(instance, problem, autoshard, winner)


def missing_row(instance: str, why: str) -> dict:
    return {"instance": instance, "notes": why}


def geometric_mean(rows: Sequence[dict]) -> tuple[float | None, int]:
    """(geometric mean of the rows' ratios, how many rows have one)."""
    ratios = [row["ratio"] for row in rows if row.get("ratio") is not None]
    if not ratios:
        return None, 0
    return math.exp(math.fsum(math.log(r) for r in ratios) / len(ratios)), len(ratios)


def table(rows: Sequence[dict]) -> str:
    """A Markdown table of the rows, then the geometric mean of the ratios."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [
            row["instance"],
            _number(row.get("nodes")),
            _number(row.get("autoshard_cost")),
            _number(row.get("winner_cost")),
            f"{row['ratio']:.5f}" if row.get("ratio") is not None else "-",
            _number(row.get("bound")),
            f"{100 * row['gap']:.2f}%" if row.get("gap") is not None else "-",
            f"{row['autoshard_wall']:.1f}" if row.get("autoshard_wall") is not None else "-",
            f"{row['winner_wall']:.1f}" if row.get("winner_wall") is not None else "-",
            row.get("notes") or "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    mean, count = geometric_mean(rows)
    summary = f"{mean:.5f}" if mean is not None else "-"
    lines.append("")
    lines.append(f"geometric mean of autoshard / winner: {summary} over {count} of {len(rows)} instances")
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"
