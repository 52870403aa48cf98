"""The program over the promising strategies, grown by column generation: a bound of the whole problem at the
LP's level and an answer close to it, for memory-tight programs, in seconds.

Where memory binds hard (2-layer transformers at half their replicated peak: 90,000-345,000 columns, the
limit's price 13-23% of the bound), the whole program's LP with its memory rows takes 2-30 s or more
(T5: unsolved in 29 s of CPU), HiGHS's branch-and-bound on it finds no answer within 1% in a minute, and the
Lagrangian search over TRW-S stops at its root 1-3% below the LP (its cutting planes price the rows from
decodings that TRW-S's ties make poor). The program over the strategies the root marks promising
(`solver.bounds.lagrangian_branch`: 2-6% of the columns) is small enough to solve as it stands, every
binding memory row included, and its LP says what the whole one would:

1. **Master LP** (`solver.backends.highs_relaxation.solve_relaxation`, 0.1-0.5 s): the restricted program's
   relaxation; its memory rows' duals are prices ``mu`` (1-3 rows priced on these programs).
2. **Pricing** (`LagrangianBranch.bound_at`): TRW-S at ``mu`` on the *whole* problem proves
   ``L(mu) = min_x f(x) + mu . (usage(x) - limit)``, a bound of the whole problem -- the whole LP's value
   once ``mu`` is the whole LP's optimal prices (ViT: 808.505 both, where the Lagrangian root proved
   795.1). The strategies TRW-S's beliefs rank best at ``mu`` (and its decoding's) join the master; when
   none is new, the master LP is the whole LP (up to TRW-S's own gap), else it is solved again (T5: 77-158
   strategies added, the master LP from 2402.4 down to 2393.7, the whole bound up from 2392.0 to 2393.6).
3. **Answers**: HiGHS's MIPs, every binding memory row in, over the master LP's support (T5: 269 of 685
   nodes fractional, 2,600 columns), then that support widened by the search's answer's strategies (a
   different answer: other choices at many nodes), each warm-started from the best answer so far and ending
   once that answer is within the gap of the pricing's bound (HiGHS's objective target: its own bound is
   only the restricted program's); then, unless proven, the search around the peak (`solver.large.peak`)
   over the whole problem from the best answer until proven or stalled (`PEAK_PATIENCE`): the MIP over the
   whole master found nothing better in 20 s on T5, the search 0.35% in its first 8 regions. The time left
   is split evenly among the steps still to run. Each MIP also ends once proven within ``polish_gap`` of
   its own bound (nothing much better left there), and one that a wider one follows ends once its own
   bound is above what would prove the gap (T5: the support's MIP, whose optimum 2412.8 is 1.4% above the
   bound, stopped after 0.2-0.3 s at its root instead of 1.1-1.3 s to that optimum; the widened MIP finds
   2402.1 without it as its start). With ``polish``, the support's MIP (a small program) is
   solved to ``polish_gap`` of the pricing's bound even where the gap is proven (llama3-8b, 8 layers on 8x8:
   its optimum, where the first answer within 1% was 0.9% above; on the tight programs it cost Gemma 3.5 s).

Every answer fits the whole problem's memory (checked), so the best one and the best bound are a
certificate of the whole problem.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from solver.backends.base import BackendLimits
from solver.backends.highs import solve_mip
from solver.backends.highs_relaxation import INTEGRAL_TOLERANCE, LinearSolution, solve_relaxation
from solver.bounds.lagrangian_branch import LagrangianBranch
from solver.compact import CompactProblem
from solver.ilp import IntegerProgram, binding_memory_times, build_program, memory_times_over, memory_unit
from solver.large.peak import PeakSettings, peak_lns
from solver.large.pruned import from_restricted, restrict, to_restricted
from solver.large.regions import RegionSearch

log = logging.getLogger(__name__)

#: Column generation rounds at most (T5, ViT, BERT: no new strategy after 2-3) ...
MAX_ROUNDS = 6
#: ... and it has converged when a round's strategies lowered the master LP by less than this share, or when
#: the master LP is within this share of the gap asked for of the priced bound: the whole LP lies between the
#: two, so more strategies could move either by no more than that (T5: round 3 left 0.01% between them, and
#: round 4 added nothing, 0.56 s later).
LP_TOLERANCE = 1e-9
CLOSED_GAP_SHARE = 0.05
#: HiGHS's cut pool (``mip_pool_soft_limit``, default 10,000) for the MIPs over the LP's support: with 100,
#: T5's took 1.3 s instead of 2.2 s and its widened one 0.8 instead of 2.5, BERT's 0.5 instead of 1.5 (CPU);
#: on the whole master it helped nowhere (BERT 6.0 -> 7.8 s). T5's widened MIP is sensitive to it (the
#: same program and start, CPU s: 20 -> 3.7, 50 -> 4.7-6.3, 100 -> 1.5-1.7, 200 -> 6.0-6.3, 1,000 -> 1.3-1.4).
SUPPORT_CUT_POOL = 100
#: The search around the peak after those MIPs stops after this many regions in a row that improved nothing,
#: or after this share of the time the solve took before it (T5 at half memory, 8.7 s before it: 2412.8 ->
#: 2404.2, 1.06% above the bound, in 2.3 s; 2402.2, 0.98%, after 23 s; nothing more in 10 regions): a small
#: problem's solve ends in seconds, not at the time limit.
PEAK_PATIENCE = 10
PEAK_TIME_SHARE = 0.5


@dataclass(frozen=True)
class Generated:
    """What `generate_and_solve` found: the best proven bound of the whole problem (its own and
    ``known_bound``), the best answer (the whole problem's strategy indices; the incumbent when nothing
    better came, None without one) and its cost, column generation rounds, the master's strategies, and
    whether the generation converged (its last round added no strategy, or none that moved the master's LP:
    the bound is the whole LP's, up to TRW-S's own gap)."""

    bound: float
    assignment: np.ndarray | None
    cost: float
    rounds: int
    strategies: int
    converged: bool


@dataclass(frozen=True)
class GenerationGoal:
    """Until when, and how close to the bound, `generate_and_solve` works."""

    deadline: float
    """A `time.perf_counter()` value."""
    relative_gap: float = 0.0
    """Stop once the best answer is proven this close to the best bound."""
    threads: int = 1
    polish_gap: float = 0.0
    """With ``polish``: the first MIP's gap (a better answer than the whole gap asks for)."""
    polish: bool = False
    seed: int = 0
    """The search around the peak's."""
    started: float | None = None
    """When the solve began, for `PEAK_TIME_SHARE`; None: the search around the peak runs to the deadline."""


def generate_and_solve(
    problem: CompactProblem,
    search: LagrangianBranch,
    keep: list[np.ndarray],
    incumbent: np.ndarray | None,
    known_bound: float,
    goal: GenerationGoal,
) -> Generated:
    """Steps 1-3 of the module docstring on ``problem`` from the strategies ``keep`` (per node, sorted; they
    hold the ``incumbent``'s), with ``search`` (whose root has run) pricing, until the best answer is proven
    within ``goal.relative_gap`` of the best bound (``known_bound`` at first), the search around the peak has
    stalled, or ``goal.deadline``."""
    deadline, relative_gap, threads, polish = goal.deadline, goal.relative_gap, goal.threads, goal.polish
    best = _Best(problem, incumbent)
    bound = known_bound
    rounds = 0
    converged = False
    master: LinearSolution | None = None
    previous = math.inf  # the master LP's value a round ago
    while rounds < MAX_ROUNDS and time.perf_counter() < deadline and not best.within(bound, relative_gap):
        restricted = restrict(problem, keep)
        program = build_program(restricted, memory_times=binding_memory_times(restricted))
        master = solve_relaxation(program, deadline - time.perf_counter(), threads)
        if master is None:
            break
        rounds += 1
        mu = _memory_prices(problem, restricted, program, master, search.row_times)
        priced, answer, _cost = search.bound_at(mu, deadline)
        bound = max(bound, priced)
        if answer is not None:
            best.offer(answer)
        promising = search.promising_strategies()
        grown = [np.union1d(kept, more) for kept, more in zip(keep, promising, strict=True)]
        if best.assignment is not None:
            grown = [np.union1d(kept, [s]) for kept, s in zip(grown, best.assignment.tolist(), strict=True)]
        added = sum(len(g) - len(k) for g, k in zip(grown, keep, strict=True))
        log.debug(
            "round %d: master LP %.8g over %d columns, priced bound %.8g, best %.8g, %d strategies added",
            rounds,
            master.objective,
            program.num_variables,
            priced,
            best.cost,
            added,
        )
        # Converged once nothing is new, the master's LP is as good as the whole one's, or what the last
        # round added left it where it was (T5: a few strategies a round, tied in TRW-S's beliefs, the LP
        # unchanged to 8 digits).
        closed = master.objective - bound <= CLOSED_GAP_SHARE * relative_gap * abs(master.objective)
        if added == 0 or closed or master.objective >= previous - LP_TOLERANCE * max(1.0, abs(previous)):
            converged = True
            break
        previous = master.objective
        keep = [g.astype(np.int64) for g in grown]
        master = None  # the master's LP no longer matches ``keep``
    strategies = sum(len(kept) for kept in keep)

    def result() -> Generated:
        return Generated(min(bound, best.cost), best.assignment, best.cost, rounds, strategies, converged)

    if best.within(bound, 0.0) or time.perf_counter() >= deadline:
        return result()
    if master is None:  # the program over ``keep`` was not built, grew since, or its LP failed
        restricted = restrict(problem, keep)
        program = build_program(restricted, memory_times=binding_memory_times(restricted))
        master = solve_relaxation(program, deadline - time.perf_counter(), threads)
    neighbourhoods: list[list[np.ndarray]] = []
    if master is not None:
        support = _support(program, master.values, None)
        widened = _support(program, master.values, to_restricted(keep, incumbent))
        same = all(len(a) == len(b) for a, b in zip(support, widened, strict=True))
        neighbourhoods = [support, *([] if same else [widened])]
    for index, neighbourhood in enumerate(neighbourhoods):
        now = time.perf_counter()
        gap = goal.polish_gap if polish and index == 0 else relative_gap
        if best.within(bound, gap) or now >= deadline - 0.1:
            return result()
        until = now + (deadline - now) / (len(neighbourhoods) + 1 - index)
        target = best.target(bound, gap)
        # A MIP that a larger one follows only looks for an answer within the gap: once its own bound is above
        # the target, the larger program gets the time (T5: the support's MIP, 2412.7 at best where 2402.5 was
        # needed, took 1.1-1.3 s to its optimum where its bound passed the target after 0.2 s).
        last = index == len(neighbourhoods) - 1 or gap != relative_gap
        inner = _solve_restricted(
            restrict(restricted, neighbourhood),
            to_restricted(neighbourhood, to_restricted(keep, best.assignment)),
            until,
            goal,
            target,
            math.inf if last else target,
        )
        if inner is not None:
            best.offer(from_restricted(keep, from_restricted(neighbourhood, inner)))
        log.debug("MIP over %d strategies: best %.8g", sum(len(n) for n in neighbourhood), best.cost)
    if best.assignment is not None and not best.within(bound, relative_gap):
        now = time.perf_counter()
        started = goal.started
        until = deadline if started is None else min(deadline, now + PEAK_TIME_SHARE * (now - started))
        settings = PeakSettings(bound=bound, relative_gap=relative_gap, patience=PEAK_PATIENCE)
        answer, stats = peak_lns(problem, best.assignment, until, RegionSearch(seed=goal.seed), settings)
        best.offer(answer)
        log.debug("search around the peak: %d regions, best %.8g", stats.regions, best.cost)
    return result()


class _Best:
    """The cheapest answer that fits the whole problem's memory."""

    def __init__(self, problem: CompactProblem, incumbent: np.ndarray | None) -> None:
        self.problem = problem
        self.assignment: np.ndarray | None = None
        self.cost = math.inf
        if incumbent is not None:
            self.offer(incumbent)

    def offer(self, assignment: np.ndarray) -> None:
        cost = self.problem.cost(assignment)
        if cost >= self.cost or not math.isfinite(cost):
            return
        limit = self.problem.usage_limit
        if limit is not None and len(memory_times_over(self.problem, assignment, limit)):
            return  # within HiGHS's tolerances, over by a few bytes
        self.assignment, self.cost = np.asarray(assignment, dtype=np.int64), cost

    def within(self, bound: float, relative_gap: float) -> bool:
        return self.assignment is not None and self.cost - bound <= relative_gap * abs(self.cost)

    def target(self, bound: float, relative_gap: float) -> float:
        """The cost at which an answer is within ``relative_gap`` of ``bound``."""
        return bound / (1.0 - relative_gap) if bound > 0 else bound


def _memory_prices(
    problem: CompactProblem,
    restricted: CompactProblem,
    program: IntegerProgram,
    master: LinearSolution,
    row_times: np.ndarray,
) -> np.ndarray:
    """The master LP's memory rows' duals as prices per byte over the limit, one per row of ``row_times``
    (rows the master does not have, or that do not bind, at 0)."""
    mu = np.zeros(len(row_times))
    if "memory_cap" not in program.row_families:
        return mu
    start, stop = program.row_families["memory_cap"]
    times = binding_memory_times(restricted)
    rows = np.searchsorted(row_times, times)
    mu[rows] = np.maximum(-master.row_duals[start:stop], 0.0) / memory_unit(problem.usage_limit)
    return mu


def _support(program: IntegerProgram, values: np.ndarray, start: np.ndarray | None) -> list[np.ndarray]:
    """Per node of the restricted program: the strategies its LP solution uses (and ``start``'s)."""
    support = []
    counts = program.strategy_counts.tolist()
    for k, (offset, count) in enumerate(zip(program.x_offset.tolist(), counts, strict=True)):
        if offset < 0:
            support.append(np.arange(count, dtype=np.int64))
            continue
        used = np.flatnonzero(values[offset : offset + count] > INTEGRAL_TOLERANCE)
        if start is not None:
            used = np.union1d(used, [int(start[k])])
        support.append(used.astype(np.int64))
    return support


def _solve_restricted(
    restricted: CompactProblem,
    start: np.ndarray | None,
    deadline: float,
    goal: GenerationGoal,
    target: float,
    give_up: float = math.inf,
) -> np.ndarray | None:
    """HiGHS's MIP on ``restricted`` with every binding memory row (`SUPPORT_CUT_POOL`) on ``goal.threads``,
    until ``deadline``, an answer that costs at most ``target``, one within ``goal.polish_gap`` of its own
    bound, or its own bound above ``give_up``; its answer (``restricted``'s indices) or None."""
    program = build_program(restricted, memory_times=binding_memory_times(restricted))
    seconds = max(0.05, deadline - time.perf_counter())
    limits = BackendLimits(seconds, goal.threads, relative_gap=goal.polish_gap)
    result = solve_mip(program, limits, start, target, SUPPORT_CUT_POOL, give_up)
    return result.assignment


__all__ = ["Generated", "GenerationGoal", "generate_and_solve"]
