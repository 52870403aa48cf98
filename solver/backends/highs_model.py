"""HiGHS instances for the HiGHS backend (`solver.backends.highs`): a quiet one, its thread count, and a
program handed to it as one row-wise matrix."""

from __future__ import annotations

import os
import sys
from typing import Protocol

import highspy
import numpy as np
import scipy.sparse as sp

from solver.ilp import IntegerProgram


class ExtraRows(Protocol):
    """Rows added to a program's own (`solver.backends.highs_relaxation.SeparatedRows`: the memory rows
    found violated), each ``matrix() @ x <= upper()``."""

    @property
    def count(self) -> int: ...

    def matrix(self) -> sp.csr_matrix: ...

    def upper(self) -> np.ndarray: ...


#: HiGHS keeps one global thread scheduler per process; its size can change only after a reset. Kept as
#: (process id, threads): a forked child inherits the scheduler without its threads.
_scheduler: list[tuple[int, int]] = []


def use_threads(highs: highspy.Highs, threads: int) -> None:
    threads, pid = max(1, int(threads)), os.getpid()
    if _scheduler and _scheduler[0] != (pid, threads):
        # A blocking reset waits for the scheduler's threads to stop; in a forked child (a plan search's
        # worker, forked from a process that ran HiGHS) they do not exist and the wait never ends.
        highspy.Highs.resetGlobalScheduler(_scheduler[0][0] == pid)
    _scheduler[:] = [(pid, threads)]
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


def to_highs_lp(program: IntegerProgram, extra_rows: ExtraRows | None = None) -> highspy.HighsLp:
    matrix, row_lower, row_upper = program.matrix, program.row_lower, program.row_upper
    if extra_rows is not None and extra_rows.count:
        matrix = sp.vstack([matrix, extra_rows.matrix()], format="csr")
        row_upper = np.concatenate([row_upper, extra_rows.upper()])
        row_lower = np.concatenate([row_lower, np.full(extra_rows.count, -np.inf)])
    lp = highspy.HighsLp()
    lp.num_col_ = program.num_variables
    lp.num_row_ = matrix.shape[0]
    lp.col_cost_ = program.objective
    lp.col_lower_ = program.col_lower
    lp.col_upper_ = np.where(np.isinf(program.col_upper), highspy.kHighsInf, program.col_upper)
    lp.row_lower_ = np.where(np.isinf(row_lower), -highspy.kHighsInf, row_lower)
    lp.row_upper_ = np.where(np.isinf(row_upper), highspy.kHighsInf, row_upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = program.num_variables
    lp.a_matrix_.num_row_ = matrix.shape[0]
    lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = matrix.data.astype(np.float64)
    lp.integrality_ = [
        highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
        for flag in program.is_integer.tolist()
    ]
    return lp
