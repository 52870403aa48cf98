"""HiGHS (highspy) backend: the sparse program passed as one row-wise matrix, warm start by `setSolution`."""

from __future__ import annotations

import math
import os
import sys
import time

import highspy
import numpy as np

from solver.backends.base import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    BackendResult,
    ProgressSink,
    closing_gap,
    empty_program_result,
    integral_objective,
)
from solver.ilp import IntegerProgram

#: Largest distance from 0 or 1 at which an LP value of an ``x`` column still counts as integral.
INTEGRAL_TOLERANCE = 1e-6
#: Share of the time limit for the LP relaxation, and then for the program restricted to its support.
RELAXATION_SHARE = 0.4
SUPPORT_SHARE = 0.3


class HighsBackend:
    """HiGHS on the integer program, relaxation first.

    1. The LP relaxation (dual simplex without presolve: several times faster than the MIP root on these
       programs). When its ``x`` is integral, that answer is proven optimal and nothing else runs.
    2. Otherwise the program restricted to the strategies the relaxation uses (plus the warm start's) is
       solved as a MIP: a small program whose answer is usually close to the relaxation's bound. When the
       best answer is within ``relative_gap`` of that bound, it is returned.
    3. Otherwise the whole MIP, warm-started from the best answer, with the time that is left.
    """

    name = "highs"

    def solve(
        self,
        program: IntegerProgram,
        time_limit: float,
        threads: int,
        warm_start: np.ndarray | None = None,
        progress: ProgressSink | None = None,
        relative_gap: float = 0.0,
    ) -> BackendResult:
        if (empty := empty_program_result(program)) is not None:
            return empty
        started = time.perf_counter()
        deadline = started + time_limit
        best = _Best(program, warm_start)
        bound = -math.inf
        relaxation = _relaxation(program, RELAXATION_SHARE * time_limit, threads)
        upper = program.col_upper
        if relaxation is not None:
            bound, values, reduced_costs = relaxation
            x = values[program.is_integer]
            if np.abs(x - np.round(x)).max(initial=0.0) <= INTEGRAL_TOLERANCE:
                seconds = time.perf_counter() - started
                if progress is not None:
                    progress(seconds, bound, bound)
                return BackendResult(OPTIMAL, program.assignment(values), bound, bound, seconds, seconds)
            if progress is not None:
                progress(time.perf_counter() - started, best.objective, bound)
            upper = _fixed_by_reduced_cost(program, values, reduced_costs, bound, best)
            answer = _run_mip(
                program,
                min(SUPPORT_SHARE * time_limit, deadline - time.perf_counter()),
                threads,
                best.assignment,
                relative_gap,
                col_upper=np.minimum(upper, _support_upper(program, values, best.assignment)),
            )
            if answer.assignment is not None:
                best.offer(answer.assignment, answer.objective)
                upper = _fixed_by_reduced_cost(program, values, reduced_costs, bound, best)
            if progress is not None:
                progress(time.perf_counter() - started, best.objective, bound)
            if best.assignment is not None and _within(best.objective, bound, relative_gap, program):
                seconds = time.perf_counter() - started
                return BackendResult(FEASIBLE, best.assignment, best.objective, bound, seconds, seconds)
        answer = _run_mip(
            program,
            max(0.01, deadline - time.perf_counter()),
            threads,
            best.assignment,
            relative_gap,
            col_upper=upper,
            progress=progress,
            started=started,
        )
        if answer.status == INFEASIBLE:
            return answer
        bound = max(bound, answer.bound)
        if answer.assignment is not None:
            best.offer(answer.assignment, answer.objective)
        seconds = time.perf_counter() - started
        if best.assignment is None:
            return BackendResult.nothing(seconds, answer.status, bound)
        proven = answer.status == OPTIMAL and best.objective <= answer.objective
        if proven:
            bound = max(bound, best.objective - closing_gap(program, best.objective))
        first = answer.first_solution_seconds if answer.first_solution_seconds is not None else seconds
        status = OPTIMAL if proven else FEASIBLE
        return BackendResult(
            status, best.assignment, best.objective, min(bound, best.objective), seconds, first
        )


class _Best:
    """The best assignment seen, with its objective (including the program's constant)."""

    def __init__(self, program: IntegerProgram, warm_start: np.ndarray | None) -> None:
        self.assignment: np.ndarray | None = None
        self.objective = math.inf
        if warm_start is not None:
            columns = program.columns(warm_start)
            if columns is not None and _satisfies(program, columns):
                self.assignment = np.asarray(warm_start, dtype=np.int64)
                self.objective = float(program.objective @ columns) + program.constant

    def offer(self, assignment: np.ndarray, objective: float) -> None:
        if objective < self.objective:
            self.assignment, self.objective = assignment, objective


def _satisfies(program: IntegerProgram, columns: np.ndarray) -> bool:
    rows = program.matrix @ columns
    slack = 1e-6 * np.maximum(1.0, np.abs(rows))
    within_columns = np.all(columns <= program.col_upper + 1e-9)
    return bool(
        within_columns
        and np.all(rows >= program.row_lower - slack)
        and np.all(rows <= program.row_upper + slack)
    )


def _within(objective: float, bound: float, relative_gap: float, program: IntegerProgram) -> bool:
    return objective - bound <= max(relative_gap * abs(objective), closing_gap(program, objective))


def _run_mip(
    program: IntegerProgram,
    time_limit: float,
    threads: int,
    warm_start: np.ndarray | None,
    relative_gap: float,
    col_upper: np.ndarray | None = None,
    progress: ProgressSink | None = None,
    started: float | None = None,
) -> BackendResult:
    """HiGHS branch-and-bound on ``program`` (with ``col_upper`` instead of its upper bounds, if given)."""
    begun = time.perf_counter()
    highs = quiet_highs()
    highs.setOptionValue("time_limit", max(0.01, float(time_limit)))
    highs.setOptionValue("mip_rel_gap", float(relative_gap))
    highs.setOptionValue("mip_abs_gap", 0.999 if integral_objective(program) else 1e-9)
    highs.setOptionValue("random_seed", 0)
    _use_threads(highs, threads)
    lp = _to_highs_lp(program)
    if col_upper is not None:
        lp.col_upper_ = np.where(np.isinf(col_upper), highspy.kHighsInf, col_upper)
    highs.passModel(lp)
    if warm_start is not None:
        columns = program.columns(warm_start)
        if columns is not None:
            solution = highspy.HighsSolution()
            solution.col_value = columns.tolist()
            solution.value_valid = True
            highs.setSolution(solution)
    first_found: list[float] = []
    _subscribe_progress(highs, program, started if started is not None else begun, progress, first_found)
    if highs.run() == highspy.HighsStatus.kError:
        status = highs.modelStatusToString(highs.getModelStatus())
        raise RuntimeError(f"HiGHS failed: model status {status}")
    seconds = time.perf_counter() - begun
    model_status = highs.getModelStatus()
    info = highs.getInfo()
    bound = float(info.mip_dual_bound) + program.constant
    if not math.isfinite(bound):
        bound = -math.inf
    if model_status == highspy.HighsModelStatus.kInfeasible:
        return BackendResult.nothing(seconds, INFEASIBLE, math.inf)
    if info.primal_solution_status < 2:
        return BackendResult.nothing(seconds, NO_SOLUTION, bound)
    values = np.asarray(highs.getSolution().col_value)
    assignment = program.assignment(values)
    columns = program.columns(assignment)
    reported = float(info.objective_function_value) + program.constant
    objective = float(program.objective @ columns) + program.constant if columns is not None else math.inf
    if abs(objective - reported) > closing_gap(program, reported) / 2:
        # HiGHS (1.16) can report a better objective than the solution it hands back when a warm start is set
        # on a program with many columns fixed at 0; without the warm start it hands back the right one.
        if warm_start is not None and time.perf_counter() - begun < time_limit:
            return _run_mip(
                program,
                time_limit - (time.perf_counter() - begun),
                threads,
                None,
                relative_gap,
                col_upper,
                progress,
                started,
            )
        return BackendResult(FEASIBLE, assignment, objective, bound, seconds, seconds)
    status = OPTIMAL if model_status == highspy.HighsModelStatus.kOptimal else FEASIBLE
    first = first_found[0] if first_found else seconds
    return BackendResult(status, assignment, objective, bound, seconds, first)


def _support_upper(program: IntegerProgram, values: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """Column upper bounds allowing only the strategies with a positive LP value (and those of ``keep``)."""
    upper = program.col_upper.copy()
    x_start, x_stop = program.col_families["x"]
    unused = values[x_start:x_stop] <= INTEGRAL_TOLERANCE
    if keep is not None:
        free = program.x_offset >= 0
        unused[program.x_offset[free] + keep[free]] = False
    upper[x_start:x_stop][unused] = 0.0
    return upper


def _fixed_by_reduced_cost(
    program: IntegerProgram, values: np.ndarray, reduced_costs: np.ndarray, bound: float, best: _Best
) -> np.ndarray:
    """Column upper bounds with every column fixed at 0 that cannot be nonzero in an answer better than the
    best one (reduced-cost fixing): at the relaxation's optimum, a column at 0 with reduced cost ``d`` adds at
    least ``d`` to the relaxation's bound wherever it is 1 (and ``x``, hence ``y``, are 0 or 1 in every
    answer), so with ``d`` above the gap to the best answer it stays 0 in every better one. The best
    answer's own columns are kept, so it stays feasible."""
    upper = program.col_upper.copy()
    if best.assignment is None:
        return upper
    gap = best.objective - bound
    margin = 1e-7 * max(1.0, abs(best.objective))
    fixable = (values <= INTEGRAL_TOLERANCE) & (reduced_costs > gap + margin)
    columns = program.columns(best.assignment)
    if columns is not None:
        fixable &= columns <= INTEGRAL_TOLERANCE
    m_start, m_stop = program.col_families["m"]
    fixable[m_start:m_stop] = False
    upper[fixable] = 0.0
    return upper


def _relaxation(
    program: IntegerProgram, time_limit: float, threads: int
) -> tuple[float, np.ndarray, np.ndarray] | None:
    """(bound, column values, reduced costs) of the LP relaxation solved to optimality, else None."""
    highs = quiet_highs()
    highs.setOptionValue("time_limit", max(0.01, float(time_limit)))
    highs.setOptionValue("presolve", "off")
    highs.setOptionValue("solver", "simplex")
    _use_threads(highs, threads)
    lp = _to_highs_lp(program)
    lp.integrality_ = []
    highs.passModel(lp)
    if highs.run() == highspy.HighsStatus.kError:
        return None
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    solution = highs.getSolution()
    values, reduced_costs = np.asarray(solution.col_value), np.asarray(solution.col_dual)
    return float(highs.getObjectiveValue()) + program.constant, values, reduced_costs


#: HiGHS keeps one global thread scheduler per process; its size can change only after a reset.
_scheduler_threads: list[int] = []


def _use_threads(highs: highspy.Highs, threads: int) -> None:
    threads = max(1, int(threads))
    if _scheduler_threads and _scheduler_threads[0] != threads:
        highspy.Highs.resetGlobalScheduler(True)
    _scheduler_threads[:] = [threads]
    highs.setOptionValue("threads", threads)


def quiet_highs() -> highspy.Highs:
    """A `Highs` instance that prints nothing: its banner goes to the C-level stdout, which we keep clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            highs = highspy.Highs()
            highs.setOptionValue("output_flag", False)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return highs


def _to_highs_lp(program: IntegerProgram) -> highspy.HighsLp:
    matrix = program.matrix
    lp = highspy.HighsLp()
    lp.num_col_ = program.num_variables
    lp.num_row_ = program.num_constraints
    lp.col_cost_ = program.objective
    lp.col_lower_ = program.col_lower
    lp.col_upper_ = np.where(np.isinf(program.col_upper), highspy.kHighsInf, program.col_upper)
    lp.row_lower_ = np.where(np.isinf(program.row_lower), -highspy.kHighsInf, program.row_lower)
    lp.row_upper_ = np.where(np.isinf(program.row_upper), highspy.kHighsInf, program.row_upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = program.num_variables
    lp.a_matrix_.num_row_ = program.num_constraints
    lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = matrix.data.astype(np.float64)
    lp.integrality_ = [
        highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
        for flag in program.is_integer.tolist()
    ]
    return lp


def _subscribe_progress(
    highs: highspy.Highs,
    program: IntegerProgram,
    started: float,
    progress: ProgressSink | None,
    first_found: list[float],
) -> None:
    last_report = [0.0]

    def report(event: object, force: bool) -> None:
        now = time.perf_counter() - started
        data = event.data_out  # type: ignore[attr-defined]
        if force and not first_found:
            first_found.append(now)
        if progress is None or (not force and now - last_report[0] < 1.0):
            return
        last_report[0] = now
        primal = float(data.mip_primal_bound)
        dual = float(data.mip_dual_bound)
        progress(
            now,
            primal + program.constant if math.isfinite(primal) else math.inf,
            dual + program.constant if math.isfinite(dual) else -math.inf,
        )

    highs.cbMipImprovingSolution.subscribe(lambda event: report(event, True))
    highs.cbMipInterrupt.subscribe(lambda event: report(event, False))
