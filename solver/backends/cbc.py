"""CBC backend: the CBC binary PuLP runs (from `pulp[cbc]`), fed a free-format MPS file written vectorised.

PuLP's own model objects cost a Python object per variable, too slow for programs with millions of
columns; the program is already a sparse matrix, so it is written straight to MPS and handed to the same
binary PuLP runs, with a MIP start, a wall-clock limit and a thread count. Progress is read from CBC's log.
"""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from solver.backends.base import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Backend,
    BackendResult,
    SolveCall,
    closing_gap,
    integral_objective,
)
from solver.ilp import IntegerProgram

_INCUMBENT = re.compile(r"Integer solution of (\S+) found")
_NODES = re.compile(r"best solution, best possible (\S+)")
_PARTIAL = re.compile(
    r"best objective (\S+), took .*?\(best possible (\S+)\)|best objective (\S+) \(best possible (\S+)\)"
)
_BOUND_LINE = re.compile(r"^Lower bound:\s+(\S+)")
_CONTINUOUS = re.compile(r"Continuous objective value is (\S+)|LP Optimal .*Obj: (\S+)")


def cbc_path() -> str:
    """The CBC executable: the one `pulp[cbc]` installs (cbcbox), else the binary bundled with PuLP 3."""
    try:
        import cbcbox

        return str(cbcbox.cbc_bin_path())
    except (ImportError, OSError):
        from pulp.apis.coin_api import PULP_CBC_CMD

        return str(PULP_CBC_CMD.pulp_cbc_path)


class CbcBackend(Backend):
    name = "cbc"

    def _solve(self, program: IntegerProgram, call: SolveCall) -> BackendResult:
        with tempfile.TemporaryDirectory(prefix="autoshard-cbc-") as folder:
            model_path = Path(folder) / "model.mps"
            solution_path = Path(folder) / "solution.txt"
            write_mps(program, model_path)
            command = [cbc_path(), str(model_path), "-timeMode", "elapsed"]
            if call.warm_start is not None:
                start_path = Path(folder) / "start.txt"
                _write_mip_start(program, call.warm_start, start_path)
                command += ["-mips", str(start_path)]
            gap = 0.999 if integral_objective(program) else 1e-9
            remaining = max(1.0, call.time_limit - call.elapsed())
            command += ["-sec", f"{remaining:.2f}", "-threads", str(max(1, call.threads))]
            command += ["-ratioGap", str(call.relative_gap)]
            command += ["-allowableGap", str(gap), "-solve", "-solu", str(solution_path)]
            log = _run_with_progress(command, program, call)
            return _read_result(program, solution_path, log, call.elapsed())


def write_mps(program: IntegerProgram, path: Path) -> None:
    """Free-format MPS: rows R<i>, columns C<j>; integer columns inside MARKER blocks."""
    lines = ["NAME autoshard", "ROWS", " N OBJ"]
    lower, upper = program.row_lower, program.row_upper
    kinds = np.where(lower == upper, "E", np.where(np.isinf(lower), "L", np.where(np.isinf(upper), "G", "R")))
    lines.extend(f" {kind} R{i}" for i, kind in enumerate(kinds.tolist()))
    lines.append("COLUMNS")
    csc = program.matrix.tocsc()
    objective = program.objective.tolist()
    integer = program.is_integer.tolist()
    marker_open = False
    indptr, indices, data = csc.indptr, csc.indices.tolist(), csc.data.tolist()
    for j in range(program.num_variables):
        if integer[j] and not marker_open:
            lines.append(" MARKER 'MARKER' 'INTORG'")
            marker_open = True
        elif not integer[j] and marker_open:
            lines.append(" MARKER 'MARKER' 'INTEND'")
            marker_open = False
        if objective[j] != 0:
            lines.append(f" C{j} OBJ {objective[j]!r}")
        for k in range(indptr[j], indptr[j + 1]):
            lines.append(f" C{j} R{indices[k]} {data[k]!r}")
        if objective[j] == 0 and indptr[j] == indptr[j + 1]:
            lines.append(f" C{j} OBJ 0")
    if marker_open:
        lines.append(" MARKER 'MARKER' 'INTEND'")
    lines.append("RHS")
    rhs = np.where(kinds == "G", lower, upper)
    lines.extend(f" RHS R{i} {value!r}" for i, value in enumerate(rhs.tolist()) if value != 0)
    ranged = np.flatnonzero(kinds == "R")
    if len(ranged):
        lines.append("RANGES")
        lines.extend(f" RNG R{i} {float(upper[i] - lower[i])!r}" for i in ranged.tolist())
    lines.append("BOUNDS")
    for j, (lo, up) in enumerate(zip(program.col_lower.tolist(), program.col_upper.tolist(), strict=True)):
        if lo == up:
            lines.append(f" FX BND C{j} {lo!r}")
        else:
            if lo != 0:
                lines.append(f" LO BND C{j} {lo!r}")
            lines.append(f" PL BND C{j}" if math.isinf(up) else f" UP BND C{j} {up!r}")
    lines.append("ENDATA")
    path.write_text("\n".join(lines) + "\n", encoding="ascii")


def _write_mip_start(program: IntegerProgram, assignment: np.ndarray, path: Path) -> None:
    columns = program.columns(assignment)
    if columns is None:
        columns = np.zeros(program.num_variables)
        free = program.x_offset >= 0
        columns[program.x_offset[free] + assignment[free]] = 1.0
    integer_columns = np.flatnonzero(program.is_integer)
    lines = ["Stopped on time - objective value 0"]
    lines.extend(f"{j} C{j} {columns[j]:g} 0" for j in integer_columns.tolist())
    path.write_text("\n".join(lines) + "\n", encoding="ascii")


def _run_with_progress(command: list[str], program: IntegerProgram, call: SolveCall) -> list[str]:
    """Run CBC, forwarding incumbents and bounds from its log; kill it if it overruns the limit."""
    started, progress, time_limit = call.begun, call.progress, call.time_limit
    log: list[str] = []
    incumbent, bound = math.inf, -math.inf
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            log.append(line.rstrip("\n"))
            found = _INCUMBENT.search(line)
            nodes = _NODES.search(line)
            continuous = _CONTINUOUS.search(line)
            if found:
                incumbent = min(incumbent, float(found.group(1)) + program.constant)
            if nodes:
                bound = max(bound, float(nodes.group(1)) + program.constant)
            if continuous:
                bound = max(bound, _number(continuous.group(1) or continuous.group(2)) + program.constant)
            if progress is not None and (found or nodes or continuous):
                progress(time.perf_counter() - started, incumbent, bound)
            if time.perf_counter() - started > time_limit + 30:
                process.kill()
                break
    return log


def _read_result(
    program: IntegerProgram, solution_path: Path, log: list[str], seconds: float
) -> BackendResult:
    bound = -math.inf
    for line in log:
        for pattern in (_NODES, _CONTINUOUS, _BOUND_LINE):
            match = pattern.search(line)
            if match:
                value = next(g for g in match.groups() if g is not None)
                bound = max(bound, _number(value) + program.constant)
        partial = _PARTIAL.search(line)
        if partial:
            values = [g for g in partial.groups() if g is not None]
            bound = max(bound, _number(values[1]) + program.constant)
    first = next((i for i, line in enumerate(log) if _INCUMBENT.search(line)), None)
    first_seconds = _first_time(log, first)
    if not solution_path.exists():
        return BackendResult.nothing(seconds, NO_SOLUTION, bound)
    text = solution_path.read_text(encoding="ascii").splitlines()
    header = text[0] if text else ""
    if header.startswith("Infeasible") or "infeasible" in header.lower():
        return BackendResult.nothing(seconds, INFEASIBLE, math.inf)
    if "objective value" not in header or "no integer solution" in header.lower():
        return BackendResult.nothing(seconds, NO_SOLUTION, bound)
    values = np.zeros(program.num_variables)
    for line in text[1:]:
        parts = line.replace("**", " ").split()
        if len(parts) >= 3 and parts[1].startswith("C"):
            values[int(parts[1][1:])] = float(parts[2])
    assignment = program.assignment(values)
    objective = float(program.objective @ values) + program.constant
    optimal = header.startswith("Optimal")
    if optimal:
        bound = max(bound, objective - closing_gap(program, objective))
    first_seconds = seconds if first_seconds is None else first_seconds
    return BackendResult(
        OPTIMAL if optimal else FEASIBLE, assignment, objective, bound, seconds, first_seconds
    )


def _first_time(log: list[str], index: int | None) -> float | None:
    if index is None:
        return None
    match = re.search(r"\(([\d.]+) seconds\)", log[index])
    return float(match.group(1)) if match else None


def _number(text: str) -> float:
    try:
        return float(text.rstrip(",)"))
    except ValueError:
        return -math.inf
