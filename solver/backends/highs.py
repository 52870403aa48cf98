"""HiGHS (highspy) backend: the sparse program passed as one row-wise matrix, warm start by `setSolution`."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass

import highspy
import numpy as np

from solver.backends.base import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Backend,
    BackendLimits,
    BackendResult,
    ProgressSink,
    SolveCall,
    Started,
    closing_gap,
    empty_program_result,
    integral_objective,
)
from solver.backends.highs_model import quiet_highs, to_highs_lp, use_threads
from solver.backends.highs_relaxation import (
    SIMPLEX_DUAL,
    BestAnswer,
    Relaxation,
    SeparatedRows,
    branch_on_relaxation,
    fixed_by_reduced_cost,
    fractional_node,
    memory_weight,
    relaxation_highs,
    separated_relaxation,
    support_upper,
    within_gap,
)
from solver.ilp import IntegerProgram

log = logging.getLogger(__name__)

#: Share of the time limit for the LP relaxation, and then for the program restricted to its support.
RELAXATION_SHARE = 0.4
SUPPORT_SHARE = 0.3
#: Share of the time limit for branching on the relaxation.
BRANCH_SHARE = 0.2


class HighsBackend(Backend):
    """HiGHS on the integer program, relaxation first.

    1. The LP relaxation (dual simplex without presolve: several times faster than the MIP root on these
       programs). When its ``x`` is integral, that answer is proven optimal and nothing else runs.
    2. Otherwise a few branchings on the relaxation (`branch_on_relaxation`, best first, each child LP
       hot-started from its parent's basis). Where the fractional part is one coherent choice -- a memory
       limit met by mixing two placements of a repeated layer's weights -- one branching raises the bound most
       of the way to the optimum. When the best answer is within ``relative_gap`` of the bound, it is
       returned.
    3. Otherwise the program restricted to the strategies the relaxation uses (plus the warm start's) is
       solved as a MIP: a small program whose answer is usually close to the relaxation's bound.
    4. Otherwise the whole MIP, warm-started from the best answer, with the time that is left.
    """

    name = "highs"
    separates_memory = True

    def begin(self, program: IntegerProgram, time_limit: float, threads: int) -> Started | None:
        """The relaxation's first LP (no memory rows yet), solved in a thread by the serial dual simplex on a
        one-thread HiGHS (with two, whole solves ran 0.4-0.8 s slower); `solve` takes it from there.
        """
        if empty_program_result(program) is not None:
            return None
        highs = relaxation_highs(program, 1)
        deadline = time.perf_counter() + RELAXATION_SHARE * time_limit

        def first_lp() -> highspy.Highs:
            highs.setOptionValue("simplex_strategy", SIMPLEX_DUAL)
            highs.setOptionValue("time_limit", max(0.01, deadline - time.perf_counter()))
            highs.run()
            log.debug("first LP, begun early: %.2f s", highs.getRunTime())
            return highs

        return Started(program, first_lp)

    def _solve(self, program: IntegerProgram, call: SolveCall) -> BackendResult:
        run = _Run(program, call)
        started = call.started
        highs = started.result() if started is not None else None  # joined even if unused: one pool
        if started is not None and started.program is not program:
            highs = None
        relaxation = separated_relaxation(program, RELAXATION_SHARE * call.time_limit, call.threads, highs)
        if relaxation is not None and (answer := run.from_relaxation(relaxation)) is not None:
            return answer
        if (answer := _out_of_time_for_mip(run.best, run.bound, call.begun, run.deadline)) is not None:
            return answer
        # Without the relaxation's rows the MIP knows no memory row at all; an answer that breaks some is
        # refused (`BestAnswer.offer`), the rows it breaks are added and the MIP runs again with the time
        # left.
        return run.whole_mip(relaxation.extra_rows if relaxation is not None else SeparatedRows(program))


class _Run:
    """One `HighsBackend._solve`: the best answer so far, the bound proven so far, and the column upper
    bounds the MIPs get (tightened by reduced-cost fixing once the relaxation is solved)."""

    def __init__(self, program: IntegerProgram, call: SolveCall) -> None:
        self.program = program
        self.call = call
        self.deadline = call.begun + call.time_limit
        self.best = BestAnswer(program, call.warm_start)
        self.bound = -math.inf
        self.upper = program.col_upper

    def from_relaxation(self, relaxation: Relaxation) -> BackendResult | None:
        """Steps 1-3 of `HighsBackend` on the solved relaxation: the answer when they find one that is
        proven (optimal, or within the gap) or no time is left for the whole MIP, else None."""
        program, call, best = self.program, self.call, self.best
        self.bound, values, reduced_costs = relaxation.bound, relaxation.values, relaxation.reduced_costs
        weight = memory_weight(program)
        if fractional_node(program, values, weight) is None:
            seconds = call.elapsed()
            if call.progress is not None:
                call.progress(seconds, self.bound, self.bound)
            bound = self.bound
            return BackendResult(OPTIMAL, program.assignment(values), bound, bound, seconds, seconds)
        self._report()
        if call.relative_gap > 0:  # with none, only the MIP can close the gap
            branch_deadline = min(self.deadline, time.perf_counter() + BRANCH_SHARE * call.time_limit)
            branched = branch_on_relaxation(
                program, relaxation, best, call.relative_gap, branch_deadline, weight
            )
            self.bound = max(self.bound, branched)
        if (answer := self._reported_within_gap()) is not None:
            return answer
        if (answer := _out_of_time_for_mip(best, self.bound, call.begun, self.deadline)) is not None:
            return answer
        self.upper = fixed_by_reduced_cost(program, values, reduced_costs, relaxation.bound, best)
        support = _Mip(
            min(SUPPORT_SHARE * call.time_limit, self.deadline - time.perf_counter()),
            call.threads,
            best.assignment,
            call.relative_gap,
            col_upper=np.minimum(self.upper, support_upper(program, values, best.assignment)),
            extra_rows=relaxation.extra_rows,
        )
        answer = _run_mip(program, support)
        if answer.assignment is not None:
            columns = best.offer(answer.assignment)
            if columns is not None:
                relaxation.extra_rows.add_violated(None, columns)
            self.upper = fixed_by_reduced_cost(program, values, reduced_costs, relaxation.bound, best)
        return self._reported_within_gap()

    def whole_mip(self, extra_rows: SeparatedRows) -> BackendResult:
        """Step 4 of `HighsBackend`: the MIP with the time left, again with the rows its answer breaks."""
        program, call, best = self.program, self.call, self.best
        rounds = 0
        while True:
            whole = _Mip(
                max(0.01, self.deadline - time.perf_counter()),
                call.threads,
                best.assignment,
                call.relative_gap,
                col_upper=self.upper,
                progress=call.progress,
                started=call.begun,
                extra_rows=extra_rows,
            )
            answer = _run_mip(program, whole)
            if answer.status == INFEASIBLE:
                return answer
            self.bound = max(self.bound, answer.bound)
            if answer.assignment is None:
                break
            columns = best.offer(answer.assignment)
            if columns is None or time.perf_counter() >= self.deadline - 0.1:
                break
            if extra_rows.add_violated(None, columns, rounds) == 0:
                break
            rounds += 1
        seconds = call.elapsed()
        bound = self.bound
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

    def _report(self) -> None:
        if self.call.progress is not None:
            self.call.progress(self.call.elapsed(), self.best.objective, self.bound)

    def _reported_within_gap(self) -> BackendResult | None:
        """`_answer_within_gap`, once the progress sink has the bound."""
        self._report()
        return _answer_within_gap(self.best, self.bound, self.call.relative_gap, self.call.begun)


def _out_of_time_for_mip(
    best: BestAnswer, bound: float, begun: float, deadline: float
) -> BackendResult | None:
    """The best answer with the relaxation's bound when a MIP on the whole program would start with less time
    left than the LPs before it took: HiGHS's presolve alone overruns that (llama3-8b on 16x4, 350,000
    columns: 1.7 s of probing on a 0.44 s limit, then nothing found)."""
    now = time.perf_counter()
    if best.assignment is None or deadline - now >= now - begun:
        return None
    return BackendResult(FEASIBLE, best.assignment, best.objective, bound, now - begun, now - begun)


def _answer_within_gap(
    best: BestAnswer, bound: float, relative_gap: float, started: float
) -> BackendResult | None:
    """The best answer, once it is proven within ``relative_gap`` of ``bound`` (optimal when they meet)."""
    if best.assignment is None or not within_gap(best.objective, bound, relative_gap, best.program):
        return None
    seconds = time.perf_counter() - started
    closed = best.objective - bound <= closing_gap(best.program, best.objective)
    status = OPTIMAL if closed else FEASIBLE
    return BackendResult(status, best.assignment, best.objective, bound, seconds, seconds)


@dataclass(frozen=True)
class _Mip:
    """One run of HiGHS's branch-and-bound (`_run_mip`): its time limit, threads, warm start and gap; the
    column upper bounds to use instead of the program's, if given, and the memory rows ``extra_rows`` to
    add; the progress sink and the clock it reads (``started``; else the run's own start). It stops once an
    answer costs at most ``target`` (HiGHS's ``objective_target``: a bound from outside proves such an
    answer close enough), or once its own bound is above ``give_up`` (no answer at that cost or below is
    left in the program). ``cut_pool``: HiGHS's ``mip_pool_soft_limit``, if given."""

    time_limit: float
    threads: int
    warm_start: np.ndarray | None
    relative_gap: float
    col_upper: np.ndarray | None = None
    progress: ProgressSink | None = None
    started: float | None = None
    extra_rows: SeparatedRows | None = None
    target: float = -math.inf
    cut_pool: int | None = None
    give_up: float = math.inf


def _run_mip(program: IntegerProgram, mip: _Mip) -> BackendResult:
    """HiGHS branch-and-bound on ``program`` as ``mip`` says."""
    begun = time.perf_counter()
    highs = quiet_highs()
    highs.setOptionValue("time_limit", max(0.01, float(mip.time_limit)))
    highs.setOptionValue("mip_rel_gap", float(mip.relative_gap))
    highs.setOptionValue("mip_abs_gap", 0.999 if integral_objective(program) else 1e-9)
    highs.setOptionValue("random_seed", 0)
    if math.isfinite(mip.target):
        highs.setOptionValue("objective_target", float(mip.target - program.constant))
    if mip.cut_pool is not None:
        highs.setOptionValue("mip_pool_soft_limit", int(mip.cut_pool))
    use_threads(highs, mip.threads)
    lp = to_highs_lp(program, mip.extra_rows)
    if mip.col_upper is not None:
        lp.col_upper_ = np.where(np.isinf(mip.col_upper), highspy.kHighsInf, mip.col_upper)
    highs.passModel(lp)
    if mip.warm_start is not None:
        columns = program.columns(mip.warm_start)
        if columns is not None:
            solution = highspy.HighsSolution()
            solution.col_value = columns.tolist()
            solution.value_valid = True
            highs.setSolution(solution)
    first_found: list[float] = []
    started = mip.started if mip.started is not None else begun
    _subscribe_progress(highs, program, started, mip.progress, first_found)
    if math.isfinite(mip.give_up):
        _stop_above(highs, mip.give_up - program.constant)
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
        if mip.warm_start is not None and time.perf_counter() - begun < mip.time_limit:
            remaining = mip.time_limit - (time.perf_counter() - begun)
            return _run_mip(program, dataclasses.replace(mip, time_limit=remaining, warm_start=None))
        return BackendResult(FEASIBLE, assignment, objective, bound, seconds, seconds)
    status = OPTIMAL if model_status == highspy.HighsModelStatus.kOptimal else FEASIBLE
    first = first_found[0] if first_found else seconds
    return BackendResult(status, assignment, objective, bound, seconds, first)


def solve_mip(
    program: IntegerProgram,
    limits: BackendLimits,
    warm_start: np.ndarray | None = None,
    target: float = -math.inf,
    cut_pool: int | None = None,
    give_up: float = math.inf,
) -> BackendResult:
    """HiGHS's branch-and-bound on ``program`` as it stands -- no relaxation first, no memory row separated (a
    program with every row it needs) -- until its answer is proven within ``limits.relative_gap`` of its own
    bound, ``limits.time_limit`` seconds, an answer that costs at most ``target`` (a bound from outside the
    program proves it close enough), or its own bound above ``give_up`` (the caller has a larger program to
    search for such an answer). ``cut_pool``: HiGHS's ``mip_pool_soft_limit`` instead of its 10,000
    (`solver.large.generated`'s small programs)."""
    if (empty := empty_program_result(program)) is not None:
        return empty
    mip = _Mip(
        limits.time_limit,
        limits.threads,
        warm_start,
        limits.relative_gap,
        target=target,
        cut_pool=cut_pool,
        give_up=give_up,
    )
    return _run_mip(program, mip)


def _stop_above(highs: highspy.Highs, bound: float) -> None:
    """Interrupt ``highs``'s branch-and-bound once its dual bound (without the program's constant) is above
    ``bound``; the answer it has then, if any, is kept."""

    def check(event: object) -> None:
        if float(event.data_out.mip_dual_bound) > bound:  # type: ignore[attr-defined]
            event.data_in.user_interrupt = True  # type: ignore[attr-defined]

    highs.cbMipInterrupt.subscribe(check)


def _subscribe_progress(
    highs: highspy.Highs,
    program: IntegerProgram,
    started: float,
    progress: ProgressSink | None,
    first_found: list[float],
) -> None:
    last_report = [0.0]
    # HiGHS's incumbent, once it keeps every memory row: the MIP may know only some of them (the rest are
    # separated lazily), and an answer of that relaxation is no answer of the problem (IOPDDL B: a progress
    # line of 134,699, the memory-free optimum, against the true optimum 532,843).
    feasible = [math.inf]

    def report(event: object, force: bool) -> None:
        now = time.perf_counter() - started
        data = event.data_out  # type: ignore[attr-defined]
        if force and not first_found:
            first_found.append(now)
        if force:
            primal = float(data.mip_primal_bound)
            profile = program.memory_profile
            if profile is None or len(profile.over(np.asarray(data.mip_solution))) == 0:
                feasible[0] = min(feasible[0], primal)
        if progress is None or (not force and now - last_report[0] < 1.0):
            return
        last_report[0] = now
        dual = float(data.mip_dual_bound)
        progress(
            now,
            feasible[0] + program.constant if math.isfinite(feasible[0]) else math.inf,
            dual + program.constant if math.isfinite(dual) else -math.inf,
        )

    highs.cbMipImprovingSolution.subscribe(lambda event: report(event, True))
    highs.cbMipInterrupt.subscribe(lambda event: report(event, False))
