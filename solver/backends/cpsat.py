"""OR-tools CP-SAT backend: the same program with integer costs, scaled inside the backend.

CP-SAT needs integer coefficients. Constraint coefficients already are (0/1 and bytes). Objective costs are
multiplied by a scale ``s`` large enough that distinct costs stay distinct after rounding (``s * d >= 1``
for the smallest gap ``d`` between distinct costs; rounding is monotone, so the order is kept), capped so
that the objective fits in 62 bits. Integral costs keep ``s = 1`` and are exact. The bound CP-SAT proves
is mapped back with the worst rounding error subtracted, so it stays a valid lower bound.
"""

from __future__ import annotations

import math
import time

import numpy as np
from ortools.sat.python import cp_model

from solver.backends.base import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Backend,
    BackendResult,
    SolveCall,
)
from solver.ilp import IntegerProgram

_OBJECTIVE_BITS = 62


def objective_scale(costs: np.ndarray) -> float:
    """The smallest scale keeping distinct costs distinct after rounding (1 for integers), capped to fit."""
    finite = costs[np.isfinite(costs)]
    total = float(np.abs(finite).sum()) if len(finite) else 0.0
    cap = (2.0**_OBJECTIVE_BITS) / max(total, 1.0)
    if np.all(finite == np.round(finite)):
        return 1.0
    distinct = np.unique(finite)
    gaps = np.diff(distinct)
    smallest = float(gaps.min()) if len(gaps) else 1.0
    return min(max(1.0, 1.0 / smallest), cap)


class CpSatBackend(Backend):
    name = "cpsat"

    def _solve(self, program: IntegerProgram, call: SolveCall) -> BackendResult:
        scale = objective_scale(program.objective)
        model, variables = _build_model(program, scale)
        if call.warm_start is not None:
            columns = program.columns(call.warm_start)
            if columns is not None:
                for j in np.flatnonzero(program.is_integer).tolist():
                    model.add_hint(variables[j], round(columns[j]))
        solver = cp_model.CpSolver()
        remaining = max(0.1, call.time_limit - call.elapsed())
        solver.parameters.max_time_in_seconds = remaining
        solver.parameters.num_workers = max(1, call.threads)
        solver.parameters.random_seed = 0
        solver.parameters.relative_gap_limit = float(call.relative_gap)
        solver.parameters.absolute_gap_limit = 0.999 if scale == 1.0 else 0.0
        rounding = 0.0 if _exact(program.objective, scale) else 0.5 / scale * _max_chosen_terms(program)
        callback = _Progress(program, scale, rounding, call)
        status = solver.solve(model, callback)
        seconds = call.elapsed()
        bound = solver.best_objective_bound / scale - rounding + program.constant
        if status == cp_model.INFEASIBLE:
            return BackendResult.nothing(seconds, INFEASIBLE, math.inf)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return BackendResult.nothing(seconds, NO_SOLUTION, bound if math.isfinite(bound) else -math.inf)
        values = np.array([solver.value(v) for v in variables], dtype=np.float64)
        assignment = program.assignment(values)
        objective = float(program.objective @ values) + program.constant
        first = callback.first_seconds if callback.first_seconds is not None else seconds
        return BackendResult(
            OPTIMAL if status == cp_model.OPTIMAL and rounding == 0.0 else FEASIBLE,
            assignment,
            objective,
            min(bound, objective),
            seconds,
            first,
        )


def _exact(costs: np.ndarray, scale: float) -> bool:
    scaled = costs * scale
    return bool(np.all(scaled == np.round(scaled)))


def _max_chosen_terms(program: IntegerProgram) -> int:
    """At most this many objective terms are non-zero in any solution: one x per node, one y per edge."""
    return int((program.x_offset >= 0).sum() + len(program.free_edges))


def _build_model(program: IntegerProgram, scale: float) -> tuple[cp_model.CpModel, list[cp_model.IntVar]]:
    model = cp_model.CpModel()
    upper_m = _memory_upper_bounds(program)
    variables: list[cp_model.IntVar] = []
    m_start, _ = program.col_families["m"]
    for j, up in enumerate(program.col_upper.tolist()):
        if j >= m_start:
            variables.append(model.new_int_var(0, int(upper_m[j - m_start]), ""))
        elif up == 0:
            variables.append(model.new_constant(0))
        else:
            variables.append(model.new_bool_var(""))
    matrix = program.matrix
    indptr, indices = matrix.indptr, matrix.indices
    data = np.round(matrix.data).astype(np.int64).tolist()
    lower, upper = program.row_lower.tolist(), program.row_upper.tolist()
    for r in range(program.num_constraints):
        start, stop = indptr[r], indptr[r + 1]
        expression = cp_model.LinearExpr.weighted_sum(
            [variables[j] for j in indices[start:stop].tolist()], data[start:stop]
        )
        lo, up = lower[r], upper[r]
        if lo == up:
            model.add(expression == round(lo))
        else:
            if math.isfinite(up):
                model.add(expression <= math.floor(up + 1e-9))
            if math.isfinite(lo):
                model.add(expression >= math.ceil(lo - 1e-9))
    costs = np.round(program.objective * scale).astype(np.int64)
    used = np.flatnonzero(costs)
    model.minimize(
        cp_model.LinearExpr.weighted_sum([variables[j] for j in used.tolist()], costs[used].tolist())
    )
    return model, variables


def _memory_upper_bounds(program: IntegerProgram) -> np.ndarray:
    parts = program.memory_parts
    if parts.shape[0] == 0:
        return np.zeros(0)
    return np.asarray(np.abs(parts).sum(axis=1)).ravel()


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(
        self,
        program: IntegerProgram,
        scale: float,
        rounding: float,
        call: SolveCall,
    ) -> None:
        super().__init__()
        self._program = program
        self._scale = scale
        self._rounding = rounding
        self._started = call.begun
        self._sink = call.progress
        self.first_seconds: float | None = None

    def on_solution_callback(self) -> None:
        now = time.perf_counter() - self._started
        if self.first_seconds is None:
            self.first_seconds = now
        if self._sink is not None:
            constant = self._program.constant
            self._sink(
                now,
                self.objective_value / self._scale + constant,
                self.best_objective_bound / self._scale - self._rounding + constant,
            )


__all__ = ["FEASIBLE", "CpSatBackend", "objective_scale"]
