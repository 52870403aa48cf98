"""The HiGHS backend's LP relaxation (`solver.backends.highs`): memory rows separated, and branching on it.

The relaxation starts without memory rows; the rows of the program's `MemoryProfile` its solutions violate are
added and the LP re-solved from its basis (`_solve_separating`) until none is. On it, a short best-first
branch-and-bound (`branch_on_relaxation`) raises the bound, and its reduced costs fix columns for the MIPs
that follow (`fixed_by_reduced_cost`). Every answer found is checked against every row of the program and its
memory profile before it is kept (`BestAnswer`).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass, field

import highspy
import numpy as np
import scipy.sparse as sp

from solver.backends.base import closing_gap
from solver.backends.highs_model import quiet_highs, to_highs_lp, use_threads
from solver.ilp import IntegerProgram

log = logging.getLogger(__name__)

#: Largest distance from 0 or 1 at which an LP value of an ``x`` column still counts as integral.
INTEGRAL_TOLERANCE = 1e-6
#: The most LPs the branching on the relaxation solves.
BRANCH_MAX_LPS = 12
#: Memory rows added to an LP in its first separation round; each later round of the same LP may add twice
#: as many (so a solution violating many steps needs few rounds). One: on the 80-layer llama program one
#: row binds, and each dense row makes the re-solve dearer (8 rows at once: 2.7 s vs 1.7 s).
ROWS_PER_SEPARATION = 1
#: HiGHS's ``simplex_strategy`` values: the serial dual simplex, the parallel one (SIP).
SIMPLEX_DUAL, SIMPLEX_PARALLEL_DUAL = 1, 2


class BestAnswer:
    """The best assignment seen, with its objective (including the program's constant)."""

    def __init__(self, program: IntegerProgram, warm_start: np.ndarray | None) -> None:
        self.program = program
        self.assignment: np.ndarray | None = None
        self.objective = math.inf
        if warm_start is not None:
            self.offer(warm_start)

    def offer(self, assignment: np.ndarray) -> np.ndarray | None:
        """Keep ``assignment`` if it satisfies every row (the memory profile's too) and costs less than the
        best; its columns (None when it uses a missing pair)."""
        columns = self.program.columns(assignment)
        if columns is None or not _satisfies(self.program, columns):
            return columns
        objective = float(self.program.objective @ columns) + self.program.constant
        if objective < self.objective:
            self.assignment, self.objective = np.asarray(assignment, dtype=np.int64), objective
        return columns


def _satisfies(program: IntegerProgram, columns: np.ndarray) -> bool:
    rows = program.matrix @ columns
    slack = 1e-6 * np.maximum(1.0, np.abs(rows))
    within_columns = np.all(columns <= program.col_upper + 1e-9)
    within_memory = program.memory_profile is None or len(program.memory_profile.over(columns)) == 0
    return bool(
        within_columns
        and within_memory
        and np.all(rows >= program.row_lower - slack)
        and np.all(rows <= program.row_upper + slack)
    )


def within_gap(objective: float, bound: float, relative_gap: float, program: IntegerProgram) -> bool:
    return objective - bound <= max(relative_gap * abs(objective), closing_gap(program, objective))


@dataclass(frozen=True)
class LinearSolution:
    """An optimal solution of a program's LP relaxation: its objective (the program's constant included),
    the column values, and the rows' duals (HiGHS's signs: a binding ``<=`` row of this minimisation has a
    dual <= 0, the objective's rate of change as the row's upper bound grows)."""

    objective: float
    values: np.ndarray
    row_duals: np.ndarray


def solve_relaxation(program: IntegerProgram, time_limit: float, threads: int) -> LinearSolution | None:
    """The LP relaxation of ``program`` with exactly its rows (none separated), by the serial dual simplex
    without presolve (`relaxation_highs`); None unless solved to optimality within ``time_limit``."""
    highs = relaxation_highs(program, threads)
    highs.setOptionValue("simplex_strategy", SIMPLEX_DUAL)
    highs.setOptionValue("time_limit", max(0.01, float(time_limit)))
    if highs.run() == highspy.HighsStatus.kError:
        return None
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    solution = highs.getSolution()
    objective = float(highs.getObjectiveValue()) + program.constant
    return LinearSolution(objective, np.asarray(solution.col_value), np.asarray(solution.row_dual))


def support_upper(program: IntegerProgram, values: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """Column upper bounds allowing only the strategies with a positive LP value (and those of ``keep``)."""
    upper = program.col_upper.copy()
    x_start, x_stop = program.col_families["x"]
    unused = values[x_start:x_stop] <= INTEGRAL_TOLERANCE
    if keep is not None:
        free = program.x_offset >= 0
        unused[program.x_offset[free] + keep[free]] = False
    upper[x_start:x_stop][unused] = 0.0
    return upper


def fixed_by_reduced_cost(
    program: IntegerProgram, values: np.ndarray, reduced_costs: np.ndarray, bound: float, best: BestAnswer
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


class SeparatedRows:
    """Memory rows of the program's `MemoryProfile` added to the LP because a solution violated them."""

    def __init__(self, program: IntegerProgram) -> None:
        self.profile = program.memory_profile
        self.indices: list[int] = []

    @property
    def count(self) -> int:
        return len(self.indices)

    def matrix(self) -> sp.csr_matrix:
        assert self.profile is not None
        return self.profile.rows(np.asarray(self.indices, dtype=np.int64))

    def upper(self) -> np.ndarray:
        assert self.profile is not None
        return self.profile.upper[np.asarray(self.indices, dtype=np.int64)]

    def add_violated(self, highs: highspy.Highs | None, values: np.ndarray, round_: int = 0) -> int:
        """Add up to ``ROWS_PER_SEPARATION * 2**round_`` of the memory rows ``values`` violates, worst first,
        to these rows and to ``highs`` if given (its basis stays valid: each new row's slack is basic); how
        many."""
        if self.profile is None:
            return 0
        over = [r for r in self.profile.over(values).tolist() if r not in self.indices]
        new = np.asarray(over[: ROWS_PER_SEPARATION << min(round_, 16)], dtype=np.int64)
        if len(new) == 0:
            return 0
        self.indices.extend(new.tolist())
        if highs is None:
            return len(new)
        rows = self.profile.rows(new)
        highs.addRows(
            len(new),
            np.full(len(new), -highspy.kHighsInf),
            self.profile.upper[new],
            rows.nnz,
            rows.indptr.astype(np.int32),
            rows.indices.astype(np.int32),
            rows.data.astype(np.float64),
        )
        return len(new)


@dataclass
class Relaxation:
    """The LP relaxation solved to optimality, with the solver holding its basis (for hot starts), and the
    memory rows it needed beyond the program's."""

    highs: highspy.Highs
    bound: float
    values: np.ndarray
    reduced_costs: np.ndarray
    extra_rows: SeparatedRows
    threads: int


def separated_relaxation(
    program: IntegerProgram, time_limit: float, threads: int, highs: highspy.Highs | None = None
) -> Relaxation | None:
    """The LP relaxation solved to optimality over every memory row of the program's profile (those it
    violates are added and the LP re-solved from its basis, `_solve_separating`), else None. ``highs``: the
    relaxation's solver with its first LP already run (`HighsBackend.begin`)."""
    if highs is None:
        highs = relaxation_highs(program, threads)
    else:
        use_threads(highs, threads)
    extra_rows = SeparatedRows(program)
    _ended, values = _solve_separating(highs, extra_rows, time.perf_counter() + time_limit, threads)
    if values is None:
        return None
    reduced_costs = np.asarray(highs.getSolution().col_dual)
    bound = float(highs.getObjectiveValue()) + program.constant
    return Relaxation(highs, bound, values, reduced_costs, extra_rows, threads)


def relaxation_highs(program: IntegerProgram, threads: int) -> highspy.Highs:
    """A HiGHS instance holding the LP relaxation of ``program`` (no memory rows), set up for the simplex."""
    highs = quiet_highs()
    highs.setOptionValue("presolve", "off")
    highs.setOptionValue("solver", "simplex")
    highs.setOptionValue("user_objective_scale", _objective_scale(program))
    use_threads(highs, threads)
    lp = to_highs_lp(program)
    lp.integrality_ = []
    highs.passModel(lp)
    return highs


#: The largest cost an LP should hand HiGHS's simplex (HiGHS warns of "excessively large costs" above it).
LARGEST_LP_COST = 1e6


def _objective_scale(program: IntegerProgram) -> int:
    """HiGHS's ``user_objective_scale`` for the relaxation: the power of two that brings the largest cost
    to at most `LARGEST_LP_COST`, as HiGHS itself advises. Plans' costs reach 1e7 (seconds of resharding in
    microsecond units); scaled by 2**-4, the 80-layer llama relaxation solved in a median 4.0 s instead of
    4.7 s (4 runs each). Values and duals come back unscaled; the ``objective_bound`` option does not
    (`_solve_separating` scales it)."""
    largest = float(np.abs(program.objective).max(initial=0.0))
    if largest <= LARGEST_LP_COST:
        return 0
    return -math.ceil(math.log2(largest / LARGEST_LP_COST))


#: How `_solve_separating` ended.
_SOLVED, _CUT_OFF, _INFEASIBLE, _UNSOLVED = "solved", "cut off", "infeasible", "unsolved"


def _solve_separating(
    highs: highspy.Highs, extra_rows: SeparatedRows, deadline: float, threads: int, cutoff: float = math.inf
) -> tuple[str, np.ndarray | None]:
    """Solve the LP in ``highs``, adding violated memory rows and re-solving until none is: (how it ended,
    the column values when solved). With a finite ``cutoff`` (in HiGHS's objective, without the program's
    constant) the dual simplex stops once its objective -- a proven bound -- exceeds it (`_CUT_OFF`).

    Without memory rows the serial dual simplex runs: the LP is hyper-sparse, and HiGHS's parallel one (SIP)
    gained nothing there and took 1.9-46 s for the same 25k iterations (serial: 1.9-2.6 s) when another
    process shared the 2 cores. A memory row couples every node and makes each iteration ~10x dearer; there
    SIP is faster (re-solve of an 80-layer llama program: 1.7-2.1 s vs 2.6-3.4 s).
    """
    scale = 2.0 ** int(highs.getOptionValue("user_objective_scale")[1])
    highs.setOptionValue("objective_bound", cutoff * scale if math.isfinite(cutoff) else highspy.kHighsInf)
    round_ = 0
    while True:
        coupled = extra_rows.count > 0 and threads > 1
        highs.setOptionValue("simplex_strategy", SIMPLEX_PARALLEL_DUAL if coupled else SIMPLEX_DUAL)
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return _UNSOLVED, None
        highs.setOptionValue("time_limit", highs.getRunTime() + remaining)  # HiGHS's clock adds up runs
        if highs.run() == highspy.HighsStatus.kError:
            return _UNSOLVED, None
        model_status = highs.getModelStatus()
        if model_status == highspy.HighsModelStatus.kObjectiveBound:
            return _CUT_OFF, None
        if model_status == highspy.HighsModelStatus.kInfeasible:
            return _INFEASIBLE, None
        if model_status != highspy.HighsModelStatus.kOptimal:
            return _UNSOLVED, None
        values = np.asarray(highs.getSolution().col_value)
        added = extra_rows.add_violated(highs, values, round_)
        log.debug("LP %.2f s, %d memory rows added", highs.getRunTime(), added)
        if added == 0:
            return _SOLVED, values
        round_ += 1


def memory_weight(program: IntegerProgram) -> np.ndarray:
    """Per ``x`` column: the memory its strategy uses over the node's least, summed over the node's terms."""
    x_start, x_stop = program.col_families["x"]
    profile = program.memory_profile
    usage = profile.term_columns if profile is not None else program.memory_parts
    return np.asarray(abs(usage).sum(axis=0)).ravel()[x_start:x_stop]


def fractional_node(program: IntegerProgram, values: np.ndarray, weight: np.ndarray) -> int | None:
    """The super node to branch on in an LP solution, None when its ``x`` is integral.

    Among nodes with a fractional ``x``, the one whose used strategies differ most in memory (``weight``,
    `memory_weight`; ties and programs without memory rows: the most fractional), since a memory limit
    met by mixing placements is what keeps these relaxations fractional.
    """
    x_start, x_stop = program.col_families["x"]
    x = values[x_start:x_stop]
    fractional = (x > INTEGRAL_TOLERANCE) & (x < 1.0 - INTEGRAL_TOLERANCE)
    if not fractional.any():
        return None
    free = np.flatnonzero(program.x_offset >= 0)
    owner = np.repeat(free, program.strategy_counts[free])
    used = x > INTEGRAL_TOLERANCE
    heaviest = np.full(len(program.x_offset), -np.inf)
    lightest = np.full(len(program.x_offset), np.inf)
    largest = np.zeros(len(program.x_offset))
    np.maximum.at(heaviest, owner[used], weight[used])
    np.minimum.at(lightest, owner[used], weight[used])
    np.maximum.at(largest, owner, x)
    candidates = np.unique(owner[fractional])
    swing, spread = heaviest[candidates] - lightest[candidates], 1.0 - largest[candidates]
    return int(candidates[np.lexsort((spread, swing))[-1]])


def _padded(basis: highspy.HighsBasis, num_rows: int) -> highspy.HighsBasis:
    """``basis`` for an LP with rows added since (their slacks basic)."""
    missing = num_rows - len(basis.row_status)
    if missing <= 0:
        return basis
    padded = highspy.HighsBasis()
    padded.valid, padded.alien = basis.valid, basis.alien
    padded.col_status = basis.col_status
    padded.row_status = [*basis.row_status, *([highspy.HighsBasisStatus.kBasic] * missing)]
    return padded


def _drop_slack_memory_rows(highs: highspy.Highs, program: IntegerProgram) -> None:
    """Delete the program's ``memory_cap`` rows that are slack in the current basis (their slack basic).

    With fewer rows every child LP is faster. The basis stays valid (each deleted row takes its basic slack
    with it), and an LP with fewer rows is a relaxation, so every bound found after stays valid; answers are
    still checked against every row of ``program`` and its memory profile.
    """
    if "memory_cap" not in program.row_families:
        return
    cap_start, cap_stop = program.row_families["memory_cap"]
    status = highs.getBasis().row_status
    basic = highspy.HighsBasisStatus.kBasic
    slack = [row for row in range(cap_start, cap_stop) if status[row] == basic]
    if slack:
        highs.deleteRows(len(slack), np.asarray(slack, dtype=np.int32))


@dataclass(order=True)
class _Subproblem:
    bound: float
    order: int
    x_upper: np.ndarray = field(compare=False)
    values: np.ndarray | None = field(compare=False)
    basis: highspy.HighsBasis = field(compare=False)


def branch_on_relaxation(
    program: IntegerProgram,
    relaxation: Relaxation,
    best: BestAnswer,
    relative_gap: float,
    deadline: float,
    weight: np.ndarray,
) -> float:
    """A proven bound from best-first branch-and-bound on the relaxation, for at most `BRANCH_MAX_LPS` LPs.

    A subproblem's ``x`` is branched on `fractional_node`'s strategy of largest value: one child takes it,
    the other forbids it. Each child LP starts from its parent's basis (a few bound changes: dual simplex
    from a dual-feasible basis) and stops as soon as its dual objective proves it holds nothing more than
    half of ``relative_gap`` better than the best answer (`_cutoff`). Integral children, and children's argmax
    roundings that fit every row, are offered to ``best``. The bound is the smallest LP value still open or
    cut off (or the best answer when none is).
    """
    highs = relaxation.highs
    _drop_slack_memory_rows(highs, program)
    x_start, x_stop = program.col_families["x"]
    x_columns = np.arange(x_start, x_stop, dtype=np.int32)
    x_lower = np.zeros(x_stop - x_start)
    root = _Subproblem(
        relaxation.bound, 0, program.col_upper[x_start:x_stop].copy(), relaxation.values, highs.getBasis()
    )
    heap = [root]
    cut_off = math.inf  # the smallest bound of the subproblems cut off (within the gap of the best answer)
    solved = 0
    while heap:
        node = heap[0]
        if best.assignment is not None and within_gap(best.objective, node.bound, relative_gap, program):
            break
        k = fractional_node(program, node.values, weight) if node.values is not None else None
        if k is None or solved >= BRANCH_MAX_LPS or time.perf_counter() >= deadline:
            break
        heapq.heappop(heap)
        start = program.x_offset[k]
        chosen = start + int(np.argmax(node.values[start : start + program.strategy_counts[k]]))
        take = node.x_upper.copy()
        take[start - x_start : start - x_start + program.strategy_counts[k]] = 0.0
        take[chosen - x_start] = node.x_upper[chosen - x_start]
        forbid = node.x_upper.copy()
        forbid[chosen - x_start] = 0.0
        for x_upper in (take, forbid):
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                heapq.heappush(heap, _Subproblem(node.bound, solved + 1, x_upper, None, node.basis))
                continue
            highs.changeColsBounds(len(x_columns), x_columns, x_lower, x_upper)
            highs.setBasis(_padded(node.basis, highs.getNumRow()))
            cutoff = _cutoff(best, relative_gap, program) - program.constant
            ended, values = _solve_separating(
                highs, relaxation.extra_rows, deadline, relaxation.threads, cutoff
            )
            solved += 1
            value = max(node.bound, float(highs.getObjectiveValue()) + program.constant)
            log.debug("branch LP %d: %s, %.6g, %.2f s", solved, ended, value, highs.getRunTime())
            if ended == _CUT_OFF:
                cut_off = min(cut_off, value)
                continue
            if values is None:
                if ended != _INFEASIBLE:
                    heapq.heappush(heap, _Subproblem(node.bound, solved, x_upper, None, node.basis))
                continue
            best.offer(program.assignment(values))
            if fractional_node(program, values, weight) is not None:
                heapq.heappush(heap, _Subproblem(value, solved, x_upper, values, highs.getBasis()))
    return min(heap[0].bound if heap else math.inf, cut_off, best.objective)


def _cutoff(best: BestAnswer, relative_gap: float, program: IntegerProgram) -> float:
    """The bound above which a subproblem is dropped: it holds nothing more than half of ``relative_gap``
    better than the best answer. Half, because a child solved to the end offers its rounding: on the
    80-layer llama program, cutting children off at the whole gap left the heuristic's answer (0.4% above
    the optimum, and above the Megatron baseline); solved, a child's rounding came within 0.07%."""
    if best.assignment is None:
        return math.inf
    allowed = max(relative_gap * abs(best.objective) / 2, closing_gap(program, best.objective))
    return best.objective - allowed
