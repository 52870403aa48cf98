"""The smallest peak usage any assignment can reach: a quick lower bound and an exact program.

`min_peak_lower_bound` puts every memory term at its smallest allowed usage at once (a valid bound; exact
when each super node has one term and no forbidden pair binds). `smallest_peak` solves
``min P  s.t.  one_hot, edge marginals, memory_def,  sum_q m[q] - P <= -base[r]`` -- the program of
`solver.ilp` with the limit replaced by a variable -- to name the peak when a limit proves infeasible.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.sparse as sp

from solver.backends.base import INFEASIBLE, OPTIMAL, BackendLimits
from solver.compact import CompactProblem
from solver.errors import InfeasibleError
from solver.evaluate import interval_profile
from solver.ilp import build_program


def min_peak_lower_bound(problem: CompactProblem) -> int:
    """Peak of the profile where every term takes its smallest usage among its node's finite strategies."""
    if len(problem.term_node) == 0:
        return 0
    smallest = np.array(
        [
            int(usage[np.isfinite(problem.costs[k])].min())
            if np.isfinite(problem.costs[k]).any()
            else int(usage.min())
            for k, usage in zip(problem.term_node.tolist(), problem.term_usages, strict=True)
        ],
        dtype=np.int64,
    )
    _, usage = interval_profile(problem.term_intervals[:, 0], problem.term_intervals[:, 1], smallest)
    return int(usage.max(initial=0))


def smallest_peak(problem: CompactProblem, time_limit: float = 30.0, threads: int = 1) -> tuple[int, bool]:
    """(peak, exact): the smallest reachable peak, or a lower bound on it when time ran out.

    Raises `InfeasibleError` when no assignment at all avoids the forbidden choices.
    """
    from solver.backends.highs import HighsBackend

    program = build_program(dataclasses.replace(problem, usage_limit=0))
    if "memory_cap" not in program.row_families:
        return 0, True
    cap_start, cap_stop = program.row_families["memory_cap"]
    peak_column = sp.csr_matrix(
        (
            -np.ones(cap_stop - cap_start),
            (np.arange(cap_start, cap_stop), np.zeros(cap_stop - cap_start, int)),
        ),
        shape=(program.num_constraints, 1),
    )
    objective = np.zeros(program.num_variables + 1)
    objective[-1] = 1.0
    peak_program = dataclasses.replace(
        program,
        objective=objective,
        constant=0.0,
        matrix=sp.hstack([program.matrix, peak_column], format="csr"),
        col_lower=np.append(program.col_lower, 0.0),
        col_upper=np.append(program.col_upper, np.inf),
        is_integer=np.append(program.is_integer, False),
        memory_parts=sp.hstack(
            [program.memory_parts, sp.csr_matrix((program.memory_parts.shape[0], 1))], "csr"
        ),
        memory_profile=None,  # the rows' right-hand side is the peak column here, not a limit
    )
    result = HighsBackend().solve(peak_program, BackendLimits(time_limit, threads))
    if result.status == INFEASIBLE:
        raise InfeasibleError("no assignment avoids the forbidden strategies and strategy pairs")
    if result.status == OPTIMAL:
        return round(result.objective), True
    bound = result.bound if math.isfinite(result.bound) else 0.0
    return max(math.ceil(bound - 1e-6), min_peak_lower_bound(problem)), False
