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
    empty_program_result,
    integral_objective,
)
from solver.ilp import IntegerProgram


class HighsBackend:
    name = "highs"

    def solve(
        self,
        program: IntegerProgram,
        time_limit: float,
        threads: int,
        warm_start: np.ndarray | None = None,
        progress: ProgressSink | None = None,
    ) -> BackendResult:
        if (empty := empty_program_result(program)) is not None:
            return empty
        started = time.perf_counter()
        highs = quiet_highs()
        highs.setOptionValue("time_limit", max(0.01, float(time_limit)))
        highs.setOptionValue("mip_rel_gap", 0.0)
        highs.setOptionValue("mip_abs_gap", 0.999 if integral_objective(program) else 1e-9)
        highs.setOptionValue("random_seed", 0)
        _use_threads(highs, threads)
        highs.passModel(_to_highs_lp(program))
        if warm_start is not None:
            columns = program.columns(warm_start)
            if columns is not None:
                solution = highspy.HighsSolution()
                solution.col_value = columns.tolist()
                solution.value_valid = True
                highs.setSolution(solution)
        first_found: list[float] = []
        _subscribe_progress(highs, program, started, progress, first_found)
        if highs.run() == highspy.HighsStatus.kError:
            status = highs.modelStatusToString(highs.getModelStatus())
            raise RuntimeError(f"HiGHS failed: model status {status}")
        seconds = time.perf_counter() - started
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
        objective = float(info.objective_function_value) + program.constant
        status = OPTIMAL if model_status == highspy.HighsModelStatus.kOptimal else FEASIBLE
        if status == OPTIMAL:
            bound = max(bound, objective - (0.999 if integral_objective(program) else 1e-9 * abs(objective)))
        first = first_found[0] if first_found else seconds
        return BackendResult(status, assignment, objective, bound, seconds, first)


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
