"""Solve a `Problem`: reductions, a heuristic incumbent, an exact backend, a certificate.

Pipeline: `reductions.reduce` -> `compact` (groups become super nodes) -> with a memory limit and a gap to
meet, first the Lagrangian search over TRW-S (`_lagrangian_search`: a bound without any LP), then the program
over the strategies it found promising:

- where the search proved the gap (llama3-8b plans), that program solved exactly to a share of the gap, for
  a better answer;
- where it did not, or where memory's price is a large share of its root's bound (`TIGHT_PRICE_SHARE`:
  the search stops at its root there), and the whole program is not huge: column generation
  (`solver.large.generated`): the program's LP with every binding memory row (the *master*) prices memory,
  TRW-S at those prices bounds the whole problem at its LP's level and names the strategies to add; then
  MIPs over the master LP's support, then widened by the incumbent's strategies, then the search around the
  peak, each until its answer is proven within the gap. On the 13 2-layer transformers of the zoo at half
  their replicated peak (issue 24) this proves 1% in 0.5-4.5 s (T5: 3.9-4.2 s), where the whole program's LP
  took 2-30 s or more, HiGHS on it found nothing within 1% in a minute and the search's root stopped 1-3%
  below the LP (before: up to the whole 60 s, gaps up to 7%);

when that proves the gap, it is the answer; where memory is tight and column generation converged, its answer
is the answer too, proven or not: its bound is the whole LP's, which nothing after it lifts, and it already
ran the search around the peak -- a small problem's solve ends in seconds, not at the time limit ->
otherwise `heuristic_solve` (anytime, feasible incumbent in seconds; before a whole-program backend it
stops once stale) -> then, by size:

- the whole program (`_solve_whole`): `ilp.build_program` with memory rows added lazily (only steps some
  assignment could overflow, then the steps an answer violates; HiGHS starts with none and separates the
  rows its LP solutions violate from the program's `MemoryProfile`) + a backend warm-started from the
  incumbent; where the memory limit binds somewhere (*tight*: some step some assignment could overflow),
  for `PEAK_WHOLE_SHARE` of the work time, then, unless it proved its answer, large neighbourhood search
  around the peak (`solver.large.peak`); tight and larger than the search's largest region, no whole
  program: the memory-priced Lagrangian bound, then the program over the strategies its prices and the
  Lagrangian search make promising (`solver.large.priced`), then the search over all strategies;
- too large for that, few nodes (`solver.large.pruned`): TRW-S bound and beliefs, the program over each node's
  best strategies solved whole, then large neighbourhood search if the gap is still open;
- too large, many nodes: large neighbourhood search (`solver.large.lns`; the search around the peak was
  measured worse there: M and S at 60 s, +0.1% and +0.5%, though U -16%) on one core, while the heuristic
  goes on from its best answer on another (`solver.parallel`) and the search takes its answers when cheaper
  (N at 60 s: 238e9 -> 208-210e9). Where the limit binds, the heuristic first stops once stale and the
  memory-priced bound comes before the search; where its prices leave a program small enough to solve whole,
  that program (`solver.large.priced`) comes first (M at 60 s: 49.95e9, where the search alone reached
  52.0-52.1e9; the ascent's own decoded answer was 49.96e9). The whole path of the tight programs above
  measured worse on N, R, S, T, U (3-74%);

-> the best assignment, mapped back and re-costed by the independent evaluator. The time limit holds for the
whole: the phases after the reductions share the time left then (never less than `MIN_LEFT_SHARE` of it).
The bound is the best proven lower bound (the backend's, TRW-S's, the memory-priced Lagrangian's, or every
node and edge at its cheapest entry). ``relative_gap`` lets every stage stop once its answer is proven that
close.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from solver.backends import BACKEND_NAMES, get_backend
from solver.backends.base import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    BackendResult,
    Started,
    closing_gap,
)
from solver.bounds.lagrangian_branch import ROUNDING_NOISE, BranchResult, LagrangianBranch
from solver.bounds.memory_priced import PricedAscent, memory_dual_bound, memory_priced_ascent
from solver.bounds.min_peak import min_peak_lower_bound, smallest_peak
from solver.compact import CompactProblem, compact
from solver.errors import InfeasibleError
from solver.evaluate import evaluate
from solver.heuristics.anytime import warm_up
from solver.heuristics.portfolio import background_search, portfolio_solve
from solver.ilp import IntegerProgram, binding_memory_times, build_program, memory_times_over
from solver.large.generated import generate_and_solve
from solver.large.lns import lns_improve
from solver.large.peak import MAX_COLUMNS as PEAK_MAX_COLUMNS
from solver.large.peak import peak_lns
from solver.large.priced import promising_strategies, search_restricted
from solver.large.pruned import Pruned, pruned_solve, restrict, solve_over
from solver.parallel import ForkedSearch, can_fork
from solver.problem import Problem
from solver.reductions import Reduced, reduce

log = logging.getLogger(__name__)

#: Programs up to this many variables go whole to a backend; larger ones get the heuristic and then large
#: neighbourhood search with the backend.
FULL_PROGRAM_MAX_VARIABLES = 1_500_000
#: Without a backend on the whole program: TRW-S for at most this share of the time limit, then the program
#: over the strategies its beliefs rank best (`solver.large.pruned`) for at most the next share.
PRUNED_TRWS_SHARE = 0.25
PRUNED_SOLVE_SHARE = 0.25
#: ... and only with at most this many super nodes that have a choice (see `_use_pruned`).
PRUNED_MAX_NODES = 2_000
#: How long (relative to the time its last improvement took) the heuristic may go without improving before a
#: backend that takes the whole program starts.
HEURISTIC_PATIENCE = 1.0
#: ... where an improvement counts only when it is at least this share of the cost (below the gaps plans ask
#: for: on the 32-layer llama program, gains of ~0.01% kept the heuristic going for 5.9 s instead of 1.5).
HEURISTIC_MIN_GAIN = 1e-3
#: ... and at least this long without one (index: whether the backend solves the relaxation first, HiGHS).
#: A relaxation-first backend needs the incumbent only as a fallback and a cut-off: 2.5 of 2.7 s of the
#: solve of llama3-8b on a mesh of 64 went to the heuristic with a 1 s wait.
HEURISTIC_QUIET_S = {False: 1.0, True: 0.25}
#: Memory rows the first whole program gets: steps the incumbent fills to this share of the limit.
LAZY_MEMORY_START = 0.9
#: Solve modes: the whole program, the heuristic alone, the heuristic then region-by-region search.
FULL, HEURISTIC, LNS = "full", "heuristic", "lns"
#: The phases after the reductions share the time left then, but never less than this share of the limit
#: (the reductions of a large problem may take most of a short one, and an answer is still owed).
MIN_LEFT_SHARE = 0.25
#: The heuristic's least time: this long, or this share of the time left when that is shorter (its first
#: kernel calls run before it reads the clock, so even a tiny budget gets an answer).
HEURISTIC_MIN_S = 0.5
HEURISTIC_MIN_SHARE = 0.25
#: Share of the time left for mapping back and re-costing the answer.
FINISH_RESERVE = 0.02
#: Share of the time limit kept for the Lagrangian bound when no exact backend runs on the whole program
#: (TRW-S needs 5-15 s to stall on a 4x4x4-mesh llama problem; 5% of a minute left a 61% gap, 20% 3.7%).
BOUND_SHARE = 0.2
#: When a gap is asked for, at most this share of the time limit goes to the Lagrangian search over TRW-S
#: before the heuristic and the backend (on llama3-8b plans on 8x8 it proves a 1% gap alone in 0.1-0.6 s,
#: where the whole program's LPs took 2.5-7 s). Exact proofs stay with the backend: on IOPDDL A the search
#: came within 6 of 6.5e9 in 3.6 s and could not close it ...
LAGRANGIAN_SHARE = 0.1
#: ... but at least this long, or this share of the time left when that is shorter: under short limits a
#: tenth was too little for the root of a memory-tight program (llama3-8b on 8x8 under 37.2 GiB, a 3 s limit:
#: 0.3 s for the search, 2.8-2.9 s to an answer 2.1% above the fastest; with 1 s for it, 0.95-0.98 s to one
#: 0.88% above, as with a 10-60 s limit) ...
LAGRANGIAN_MIN_S = 1.0
LAGRANGIAN_MIN_SHARE = 0.34
#: ... which gives up after its root when that is this far from its best answer (TRW-S is not tight there);
LAGRANGIAN_GIVE_UP_GAP = 0.05
#: ... then, where its answer is proven within the gap, the program over its promising strategies is solved to
#: this share of the gap asked for (0.25 of 1%: 0.08 s on the 80-layer program, against 1.6 s to optimality
#: for the same answer) ...
RESTRICTED_GAP_SHARE = 0.25
#: ... in at most this share of the time limit; where the gap is still open, the program over them grown by
#: column generation (`solver.large.generated`) ...
RESTRICTED_SHARE = 0.1
#: ... up to this many columns in the whole program (TRW-S prices the master's strategies on it every round:
#: 0.1-0.5 s on the 2-layer transformers at 90,000-345,000 columns, 4 s on llama3-8b on 4x4x4, 7.2M).
GENERATION_MAX_COLUMNS = 1_000_000
#: Where memory's price is at least this share of the root's bound (`LagrangianBranch.memory_price_share`:
#: the 2-layer transformers at half their replicated peak 13-23%, llama3-8b plans 0-5%), the search stops at
#: its root and column generation follows at once: branching on usage stalled there (Gemma: 6-16
#: subproblems in 6 s, +0.002 on a 30.7 gap) and the promising strategies' program, polished to a share of
#: the gap, took 2.4-5.6 s on GPT-2 where column generation's answer came in 1 s.
TIGHT_PRICE_SHARE = 0.1
#: ... and column generation gets up to this share of the time left (rather than `RESTRICTED_SHARE`): there
#: it is the main path (T5 at half memory: 3.9-4.2 s to its answer within 1%), and where it converges the
#: solve ends with it.
TIGHT_GENERATION_SHARE = 0.5
#: Where the memory limit binds somewhere (`binding_memory_times`), the whole program gets this share of the
#: work time after the heuristic; unless it proves its answer, large neighbourhood search around the peak
#: (`solver.large.peak`) takes the rest from the best answer (run first, the search delayed the proofs of
#: A and G, optimal in 7 and 3 s, to 20 and 11 s) ...
PEAK_WHOLE_SHARE = 0.5
#: ... and no whole program runs when it has more columns than the search's largest region (V: 784,000
#: columns, where HiGHS found nothing in 54 s): the program over the strategies memory prices make promising
#: (`solver.large.priced`) gets this share of the work time, then the search goes on over all of them. V at
#: 60 s: 1.95M when the promising strategies were the Lagrangian search's alone (at no price on V) and the
#: search ran region by region over them; 1.617M (the contest winner's cost) with the subgradient ascent's.
PEAK_WHOLE_MAX_COLUMNS = PEAK_MAX_COLUMNS
PRICED_SHARE = 0.5
#: The program over the promising strategies goes whole to the backend up to this many columns, else region
#: by region (V: 18,000-40,000 columns, optimal in 15-31 s, where the search by regions over 36,000 stalled
#: at 2.22M; K: more).
PRICED_WHOLE_MAX_COLUMNS = PEAK_MAX_COLUMNS
#: Progress events: (phase, seconds since start, incumbent cost or inf, bound or -inf).
ProgressCallback = Callable[[str, float, float, float], None]


@dataclass
class SolveResult:
    """What `solve` returns (and the CLI prints)."""

    solution: list[int] | None
    cost: float | None
    status: str
    bound: float
    gap: float | None
    seconds: float
    first_solution_seconds: float | None
    variables: int
    constraints: int
    backend: str
    peak_usage: int | None = None
    usage_limit: int | None = None
    reductions: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bound"] = _json_number(self.bound)
        return data


def solve(
    problem: Problem,
    backend: str = "auto",
    time_limit: float = 60.0,
    threads: int = 2,
    progress: ProgressCallback | None = None,
    seed: int = 0,
    use_reductions: bool = True,
    heuristic_share: float | None = None,
    relative_gap: float = 0.0,
    cutoff: float | None = None,
    explain_infeasible: bool = True,
) -> SolveResult:
    """Best assignment found within `time_limit` seconds, with a proven bound.

    ``relative_gap``: an exact backend may stop once its answer is proven within this share of the optimum.
    ``cutoff``: answers costing more are of no use to the caller (the headroom pass's cap): once the memory-
    aware bound proves that none costs less, the solve stops with what it has (its bound above ``cutoff``).

    Raises `InfeasibleError` when no assignment fits the memory limit (naming the smallest reachable peak;
    without ``explain_infeasible``, a limit below every node's smallest usage is refused with that bound
    alone, not the smallest peak's own program: a caller that tries another problem next has no use for it)
    or every strategy of some node is forbidden.
    """
    if backend not in (*BACKEND_NAMES, "auto", "heuristic"):
        raise ValueError(f"unknown backend {backend!r}; choose cbc, highs, cpsat, heuristic or auto")
    started = time.perf_counter()
    deadline = started + time_limit
    timings: dict[str, float] = {}
    tracker = _Tracker(started, progress)

    phase = time.perf_counter()
    reduced = reduce(problem) if use_reductions else reduce(problem, enabled=())
    timings["reductions"] = time.perf_counter() - phase
    phase = time.perf_counter()
    core = compact(reduced.problem)
    timings["compact"] = time.perf_counter() - phase
    _check_memory_possible(core, explain_infeasible)

    engine, mode = _plan(core, backend)
    tight = mode != HEURISTIC and len(binding_memory_times(core)) > 0
    # Every phase's share is of the time left now, after the reductions: on a plan search's short limits the
    # reductions of a large problem take much of it, and shares of the whole limit would overrun it.
    now = time.perf_counter()
    left = max(deadline - now, MIN_LEFT_SHARE * time_limit)
    bound_deadline = now + (1.0 - FINISH_RESERVE) * left
    work_deadline = bound_deadline - (0.0 if mode == FULL and not tight else BOUND_SHARE * left)

    known_bound = -math.inf
    searched: BranchResult | None = None
    final = False
    if mode != HEURISTIC and core.usage_limit is not None and relative_gap > 0:
        least = min(LAGRANGIAN_MIN_S, LAGRANGIAN_MIN_SHARE * left)
        search_deadline = now + max(least, LAGRANGIAN_SHARE * left)
        searched, final = _lagrangian_search(
            core, engine, relative_gap, search_deadline, left, threads, timings, seed, started
        )
        if searched is not None:
            known_bound = searched.bound
            tracker.update("lagrangian", searched.cost + reduced.constant, searched.bound + reduced.constant)
            if cutoff is not None and known_bound + reduced.constant > cutoff:
                columns, rows = program_shape(core)
                kept = [] if searched.assignment is None else [searched.assignment]
                bound = known_bound + reduced.constant
                return _finish(
                    problem, reduced, core, kept, None, bound, "lagrangian", columns, rows, tracker, timings
                )
    if searched is not None and searched.assignment is not None and (final or searched.within(relative_gap)):
        candidates = [searched.assignment]
        phase = time.perf_counter()
        # Final but not proven: the bound is the whole LP's already; the memory-priced ascent stays below it.
        bound = (
            _lower_bound(core, None, candidates, bound_deadline, relative_gap, known_bound, not final)
            + reduced.constant
        )
        timings["bound"] = time.perf_counter() - phase
        columns, rows = program_shape(core)  # the program the certificate stands for (never built)
        return _finish(
            problem, reduced, core, candidates, None, bound, "lagrangian", columns, rows, tracker, timings
        )

    relaxation_first = mode == FULL and get_backend(engine).separates_memory
    stagnation = _Stagnation(time.perf_counter(), HEURISTIC_QUIET_S[relaxation_first])
    priced_first = mode == FULL and tight and program_size(core) > PEAK_WHOLE_MAX_COLUMNS
    early = mode == FULL and not priced_first
    # Too large for the whole program and tight: the heuristic stops once stale (it goes on from its best
    # answer on another core) and the memory prices decide what comes next.
    priced_lns = mode == LNS and tight and not _use_pruned(core)
    first_work = _begin_whole(core, engine, work_deadline, threads, timings) if early else None
    phase = time.perf_counter()

    def on_incumbent(cost: float, _assignment: np.ndarray) -> None:
        stagnation.improved(cost)
        tracker.incumbent("heuristic", cost + reduced.constant)

    def stop_heuristic() -> bool:
        if first_work is None:
            return stagnation.stalled()
        # While the backend's first work runs on the other core, searching on costs nothing; after it, the
        # backend waits, so the heuristic stops once quiet (without the patience its late gains would earn).
        return first_work.done() and stagnation.quiet_now()

    share = heuristic_share if heuristic_share is not None else _heuristic_share(core, mode)
    least = min(HEURISTIC_MIN_S, HEURISTIC_MIN_SHARE * left)
    budget = max(least, share * (work_deadline - time.perf_counter()))
    warm_up()
    incumbent = portfolio_solve(
        core,
        time_limit=budget,
        threads=1 if mode == FULL else threads,
        seed=seed,
        on_incumbent=on_incumbent,
        stop=stop_heuristic if mode == FULL or priced_lns else None,
    )
    timings["heuristic"] = time.perf_counter() - phase
    candidates = [] if incumbent is None else [incumbent]
    if searched is not None and searched.assignment is not None:
        candidates.append(searched.assignment)
        if incumbent is None or searched.cost < core.cost(incumbent):
            incumbent = searched.assignment

    # Large neighbourhood search takes one core; the heuristic goes on from its best answer on another until
    # the bound's deadline (on N its long descents are what find the cheap answers: 239e9 after half the work
    # time, 208e9 after all of it), and the search takes its answers whenever they are cheaper.
    background = (
        [background_search(core, bound_deadline - time.perf_counter(), seed + threads, initial=incumbent)]
        if mode == LNS and threads > 1 and incumbent is not None and can_fork()
        else []
    )
    whole = mode == FULL and not priced_first
    if priced_first and incumbent is not None:
        constant = reduced.constant
        # The memory-priced bound first (it converges in seconds, V: 1.5 s, short of the share kept for it):
        # its prices say which strategies the search should look at.
        priced, answers = _priced_phase(
            core, engine, incumbent, left, bound_deadline, threads, seed, tracker, constant, timings, False
        )
        known_bound = max(known_bound, priced)
        candidates.extend(answers)
        incumbent = answers[-1]
        work_deadline = bound_deadline
        phase = time.perf_counter()
        incumbent = _peak_search(
            core, engine, incumbent, work_deadline, seed, tracker, constant, known_bound, relative_gap
        )
        timings["peak_lns"] = time.perf_counter() - phase
        candidates.append(incumbent)

    exact: BackendResult | None = None
    variables = constraints = 0
    if whole and time.perf_counter() < work_deadline - 0.2:
        phase = time.perf_counter()
        built_before = timings.get("build", 0.0)
        whole_deadline = phase + (PEAK_WHOLE_SHARE if tight else 1.0) * (work_deadline - phase)
        exact, variables, constraints = _solve_whole(
            core,
            engine,
            incumbent,
            whole_deadline,
            threads,
            lambda cost, bound: tracker.update(engine, cost + reduced.constant, bound + reduced.constant),
            timings,
            relative_gap,
            first_work,
        )
        timings["backend"] = time.perf_counter() - phase - (timings["build"] - built_before)
        if exact.assignment is not None:
            candidates.append(exact.assignment)
        known_bound = max(known_bound, exact.bound)
        best_answer = min(candidates, key=core.cost) if candidates else None
        # T5 and ViT at half memory: HiGHS within 0.8% of its bound in 2 s, then the search ran out the whole
        # minute (issue 24): it stops once the gap asked for is proven, and does not start when it is.
        if tight and exact.status != OPTIMAL and best_answer is not None:
            phase = time.perf_counter()
            candidates.append(
                _peak_search(
                    core,
                    engine,
                    best_answer,
                    work_deadline,
                    seed,
                    tracker,
                    reduced.constant,
                    known_bound,
                    relative_gap,
                )
            )
            timings["peak_lns"] = time.perf_counter() - phase
    elif first_work is not None:
        first_work.result()  # no solver may run on when the next one starts (HiGHS shares one thread pool)
    elif mode == LNS and incumbent is not None:
        if _use_pruned(core):
            phase = time.perf_counter()
            pruned = _pruned(
                core, engine, incumbent, left, work_deadline, threads - len(background), relative_gap
            )
            timings["pruned"] = time.perf_counter() - phase
            known_bound = max(known_bound, pruned.bound)
            if pruned.assignment is not None and core.cost(pruned.assignment) < core.cost(incumbent):
                incumbent = pruned.assignment
                candidates.append(incumbent)
                cost = core.cost(incumbent) + reduced.constant
                tracker.update("pruned", cost, known_bound + reduced.constant)
        elif priced_lns:
            # The memory-priced bound now rather than after the search (the time is the same), and where
            # its prices leave a program small enough to solve whole, that program first (M at 60 s: 49.95e9
            # where the search alone reached 52.0-52.1e9; N, R, T, U: too large; S: small enough, too large
            # once the cutting planes' strategies join, so searched by regions).
            priced, answers = _priced_phase(
                core,
                engine,
                incumbent,
                left,
                bound_deadline,
                threads - len(background),
                seed,
                tracker,
                reduced.constant,
                timings,
                True,
            )
            known_bound = max(known_bound, priced)
            candidates.extend(answers)
            incumbent = answers[-1]
            work_deadline = bound_deadline
        best = core.cost(incumbent)
        if best - known_bound > relative_gap * abs(best):
            phase = time.perf_counter()
            improved, _stats = lns_improve(
                core,
                incumbent,
                deadline=work_deadline,
                backend=engine,
                seed=seed,
                on_incumbent=lambda cost, _a: tracker.incumbent(f"{engine}-lns", cost + reduced.constant),
                outside=lambda: _read_background(background, tracker, reduced.constant),
            )
            timings["lns"] = time.perf_counter() - phase
            candidates.append(improved)

    phase = time.perf_counter()
    bound = (
        _lower_bound(
            core, exact, candidates, bound_deadline, relative_gap, known_bound, "priced_bound" not in timings
        )
        + reduced.constant
    )
    timings["bound"] = time.perf_counter() - phase
    for search in background:
        answer = search.stop()
        if answer is not None:
            tracker.incumbent("heuristic", answer[0] + reduced.constant)
            candidates.append(answer[1])
    label = engine if mode != LNS else f"{engine} (lns)"
    return _finish(
        problem, reduced, core, candidates, exact, bound, label, variables, constraints, tracker, timings
    )


def _read_background(
    background: list[ForkedSearch], tracker: _Tracker, constant: float
) -> tuple[float, np.ndarray] | None:
    """The cheapest new answer of the searches on other cores, reported; None when none came."""
    answers = [answer for answer in (search.poll() for search in background) if answer is not None]
    if not answers:
        return None
    best = min(answers, key=lambda answer: answer[0])
    tracker.incumbent("heuristic", best[0] + constant)
    return best


def _priced_phase(
    core: CompactProblem,
    engine: str,
    incumbent: np.ndarray,
    left: float,
    deadline: float,
    threads: int,
    seed: int,
    tracker: _Tracker,
    constant: float,
    timings: dict[str, float],
    only_whole: bool,
) -> tuple[float, list[np.ndarray]]:
    """`solver.large.priced`: the memory-priced ascent for `BOUND_SHARE` of the time ``left``
    (`_price_memory`), the root of the Lagrangian search for up to `LAGRANGIAN_SHARE` of it, then the program
    over the strategies both found promising for `PRICED_SHARE` of the time to ``deadline``: whole with
    ``engine`` (timed as ``priced_program``) while it has at most `PRICED_WHOLE_MAX_COLUMNS` columns, else
    region by region around the peak (``priced_lns``); with ``only_whole``, nothing after the ascent unless
    the ascent's strategies alone make a program that fits whole. (The ascent's bound, the answers, the best
    last.)"""
    ascent, incumbent = _price_memory(core, incumbent, BOUND_SHARE * left, tracker, constant, timings)
    if only_whole and (
        ascent.promising is None or not _priced_program_fits(core, ascent.promising, incumbent)
    ):
        return ascent.bound, [incumbent]

    phase = time.perf_counter()
    keep, decoded = promising_strategies(
        core, incumbent, time.perf_counter() + LAGRANGIAN_SHARE * left, also=ascent.promising
    )
    if keep is None:
        return ascent.bound, [incumbent]
    start = decoded if decoded is not None else incumbent
    tracker.incumbent("lagrangian", core.cost(start) + constant)
    now = time.perf_counter()
    until = now + PRICED_SHARE * (deadline - now)
    if program_size(restrict(core, keep)) > PRICED_WHOLE_MAX_COLUMNS:
        answer = search_restricted(
            core,
            keep,
            start,
            until,
            engine,
            seed,
            on_incumbent=lambda cost, _a: tracker.incumbent(f"{engine}-priced-lns", cost + constant),
        )
        timings["priced_lns"] = time.perf_counter() - phase
        return ascent.bound, [incumbent, answer]

    def solve_restricted(restricted: CompactProblem, local: np.ndarray | None, until: float):
        # Every row where the limit can bind, from the start: on V's program over 1,821 promising strategies
        # optimal in 17 s, where rows added as HiGHS's LPs violate them (`_solve_whole`) took 22 s.
        program = build_program(restricted, memory_times=binding_memory_times(restricted))
        result = get_backend(engine).solve(
            program, time_limit=max(0.0, until - time.perf_counter()), threads=threads, warm_start=local
        )
        if result.assignment is not None:
            tracker.incumbent(f"{engine}-priced", restricted.cost(result.assignment) + constant)
        return result.assignment

    answer = solve_over(core, keep, start, until, solve_restricted)
    timings["priced_program"] = time.perf_counter() - phase
    better = answer is not None and core.cost(answer) < core.cost(start)
    return ascent.bound, [incumbent, answer if better else start]


def _price_memory(
    core: CompactProblem,
    incumbent: np.ndarray,
    seconds: float,
    tracker: _Tracker,
    constant: float,
    timings: dict[str, float],
) -> tuple[PricedAscent, np.ndarray]:
    """`memory_priced_ascent` for at most ``seconds``, its steps sized by the ``incumbent``'s cost (timed as
    ``priced_bound``): its result, and the cheaper of the incumbent and its answer."""
    phase = time.perf_counter()
    ascent = memory_priced_ascent(core, seconds, upper_bound=core.cost(incumbent))
    timings["priced_bound"] = time.perf_counter() - phase
    if ascent.answer is not None and ascent.cost < core.cost(incumbent):
        incumbent = ascent.answer
    tracker.update("priced", core.cost(incumbent) + constant, ascent.bound + constant)
    return ascent, incumbent


def _priced_program_fits(core: CompactProblem, promising: list[np.ndarray], incumbent: np.ndarray) -> bool:
    """Whether the program over the ``promising`` strategies and the ``incumbent``'s has at most
    `PRICED_WHOLE_MAX_COLUMNS` columns."""
    keep = [
        np.union1d(kept, [int(s)]).astype(np.int64)
        for kept, s in zip(promising, incumbent.tolist(), strict=True)
    ]
    return program_size(restrict(core, keep)) <= PRICED_WHOLE_MAX_COLUMNS


def _peak_search(
    core: CompactProblem,
    engine: str,
    incumbent: np.ndarray,
    deadline: float,
    seed: int,
    tracker: _Tracker,
    constant: float,
    bound: float,
    relative_gap: float,
) -> np.ndarray:
    """`solver.large.peak.peak_lns` from ``incumbent`` until ``deadline`` or until its answer is proven within
    ``relative_gap`` of ``bound``, its incumbents reported."""
    improved, stats = peak_lns(
        core,
        incumbent,
        deadline=deadline,
        backend=engine,
        seed=seed,
        on_incumbent=lambda cost, _a: tracker.incumbent(f"{engine}-peak-lns", cost + constant),
        bound=bound,
        relative_gap=relative_gap,
    )
    log.info(
        "peak lns: %d regions, %d improved (%d at the peak), %d columns a region at the end",
        stats.regions,
        stats.improved,
        stats.peak_improved,
        stats.region_columns,
    )
    return improved


def _lagrangian_search(
    core: CompactProblem,
    engine: str,
    relative_gap: float,
    deadline: float,
    left: float,
    threads: int,
    timings: dict[str, float],
    seed: int = 0,
    started: float | None = None,
) -> tuple[BranchResult | None, bool]:
    """A certificate without the LP of the whole program (None where it does not apply: no edge, no memory
    limit, nothing feasible for TRW-S): `solver.bounds.lagrangian_branch` for the bound, then the program over
    the strategies it found promising (every decoding's, the root's best beliefs) -- a program of a few
    strategies per node. Where the search proved the gap, that program is solved whole by ``engine`` to
    `RESTRICTED_GAP_SHARE` of it for a better answer: on llama3-8b plans on 8x8 (8 to 80 layers) the two
    took 0.1-0.6 s where the whole program's LPs took 2.5-7 s, with answers as good or better. Elsewhere, or
    where memory is *tight* (its price `TIGHT_PRICE_SHARE` of the root's bound or more: the search stops at
    its root), and for programs of at most `GENERATION_MAX_COLUMNS`, column generation from it
    (`solver.large.generated`) for up to `RESTRICTED_SHARE` (tight: `TIGHT_GENERATION_SHARE`) of the
    time ``left``. (The result, and whether it is final: tight, and column generation converged, so its
    bound is the whole LP's, which nothing after it lifts, and its answer came from the search around the
    peak that the pipeline would run next.)"""
    phase = time.perf_counter()
    try:
        search = LagrangianBranch(core)
    except ValueError:
        return None, False
    generation = program_size(core) <= GENERATION_MAX_COLUMNS
    searched = search.run(
        relative_gap,
        deadline,
        give_up_gap=LAGRANGIAN_GIVE_UP_GAP,
        root_only_share=TIGHT_PRICE_SHARE if generation else math.inf,
    )
    timings["lagrangian"] = time.perf_counter() - phase
    log.info(
        "lagrangian search: %d subproblems, %d evaluations, bound %.8g, best %.8g",
        searched.subproblems,
        searched.evaluations,
        searched.bound,
        searched.cost,
    )
    if searched.within(0.0):  # proven optimal; else the program over its promising strategies may do better
        return searched, False
    phase = time.perf_counter()
    keep = search.promising_strategies()
    if searched.assignment is not None:
        chosen = searched.assignment.tolist()
        keep = [np.union1d(kept, [s]).astype(np.int64) for kept, s in zip(keep, chosen, strict=True)]
    if any(len(kept) == 0 for kept in keep):  # the search ran out of time before its root's beliefs
        return searched, False
    tight = search.memory_price_share >= TIGHT_PRICE_SHARE
    if generation and (tight or not searched.within(relative_gap)):
        generated = generate_and_solve(
            core,
            search,
            keep,
            searched.assignment,
            searched.bound,
            relative_gap,
            phase + (TIGHT_GENERATION_SHARE if tight else RESTRICTED_SHARE) * left,
            threads,
            RESTRICTED_GAP_SHARE * relative_gap,
            not tight,
            seed,
            started,
        )
        timings["restricted"] = time.perf_counter() - phase
        log.info(
            "column generation: %d rounds (%s), %d strategies, bound %.8g, best %.8g",
            generated.rounds,
            "converged" if generated.converged else "not converged",
            generated.strategies,
            generated.bound,
            generated.cost,
        )
        result = dataclasses.replace(
            searched, assignment=generated.assignment, cost=generated.cost, bound=generated.bound
        )
        return result, tight and generated.converged

    def solve_restricted(restricted: CompactProblem, start: np.ndarray | None, deadline: float):
        gap = RESTRICTED_GAP_SHARE * relative_gap
        result, _variables, _constraints = _solve_whole(
            restricted, engine, start, deadline, threads, lambda _c, _b: None, {}, gap
        )
        return result.assignment

    answer = solve_over(core, keep, searched.assignment, phase + RESTRICTED_SHARE * left, solve_restricted)
    timings["restricted"] = time.perf_counter() - phase
    if answer is None or core.cost(answer) >= searched.cost:
        return searched, False
    cost = core.cost(answer)
    return dataclasses.replace(searched, assignment=answer, cost=cost, bound=min(searched.bound, cost)), False


def _begin_whole(
    core: CompactProblem, engine: str, deadline: float, threads: int, timings: dict[str, float]
) -> Started | None:
    """The backend's first work on the whole program (`Backend.begin`: HiGHS's memory-free LP), started in a
    thread before the heuristic when the program starts without memory rows and a second core is there."""
    backend = get_backend(engine)
    if threads < 2 or not backend.separates_memory:
        return None
    phase = time.perf_counter()
    program = build_program(core, memory_times=np.zeros(0, np.int64))
    timings["build"] = time.perf_counter() - phase
    return backend.begin(program, max(0.5, deadline - time.perf_counter()), threads)


def _solve_whole(
    core: CompactProblem,
    engine: str,
    incumbent: np.ndarray | None,
    deadline: float,
    threads: int,
    on_progress: Callable[[float, float], None],
    timings: dict[str, float],
    relative_gap: float = 0.0,
    first_work: Started | None = None,
) -> tuple[BackendResult, int, int]:
    """(result, variables, constraints) of the backend on the whole program, memory rows added lazily.

    Only steps where some assignment could exceed the limit need a ``memory_cap`` row
    (`binding_memory_times`); of those, the program starts with the ones the incumbent fills to 90% or more
    -- or with none for a backend that adds the rows its LP solutions violate itself (`separates_memory`).
    When the backend's answer exceeds the limit somewhere, the steps it violates are added and the program is
    solved again (warm-started from the incumbent). Each program is a relaxation of the whole one, so its
    bound stays valid, and an answer that fits everywhere is optimal for the whole program when it is for the
    relaxation. ``first_work``: the backend's work begun on the first program (`_begin_whole`).
    """
    backend = get_backend(engine)
    needed = binding_memory_times(core)
    active = np.zeros(0, dtype=np.int64)
    if incumbent is not None and len(needed) and not backend.separates_memory:
        near = memory_times_over(core, incumbent, int(LAZY_MEMORY_START * (core.usage_limit or 0)))
        active = np.intersect1d(near, needed)
    timings.setdefault("build", 0.0)
    rounds = 0
    bound = -math.inf  # every round's program is a relaxation of the whole one: its bound holds
    while True:
        if first_work is not None and rounds == 0:
            program = first_work.program
        else:
            phase = time.perf_counter()
            program = build_program(core, memory_times=active if len(needed) else np.zeros(0, np.int64))
            timings["build"] += time.perf_counter() - phase
        result = backend.solve(
            program,
            time_limit=max(0.5, deadline - time.perf_counter()),
            threads=threads,
            warm_start=incumbent,
            progress=lambda _t, cost, bound: on_progress(cost, bound),
            relative_gap=relative_gap,
            started=first_work if rounds == 0 else None,
        )
        rounds += 1
        bound = max(bound, result.bound)
        result = dataclasses.replace(_proven_only(result, program), bound=bound)
        if result.assignment is None or core.usage_limit is None:
            break
        violated = memory_times_over(core, result.assignment, core.usage_limit)
        if len(violated) == 0:
            break
        log.info("memory rows: %d steps over the limit after round %d; adding them", len(violated), rounds)
        active = np.union1d(active, violated)
        if time.perf_counter() >= deadline - 0.5:
            result = BackendResult.nothing(result.seconds, NO_SOLUTION, result.bound)
            break
    timings["memory_rounds"] = float(rounds)
    return result, program.num_variables, program.num_constraints


def _proven_only(result: BackendResult, program: IntegerProgram) -> BackendResult:
    """A backend stopped by a relative gap may call its answer optimal: it is only feasible unless the bound
    meets it."""
    if result.status != OPTIMAL:
        return result
    if result.objective - result.bound <= closing_gap(program, result.objective):
        return result
    return dataclasses.replace(result, status=FEASIBLE)


def _lower_bound(
    core: CompactProblem,
    exact: BackendResult | None,
    candidates: list[np.ndarray],
    deadline: float,
    relative_gap: float = 0.0,
    known_bound: float = -math.inf,
    price_memory: bool = True,
) -> float:
    """The best proven bound on the compact problem: the backend's, else the Lagrangian dual bound with the
    memory limit priced in (an incumbent's cost sizes its steps; not again when ``price_memory`` is False:
    ``known_bound`` holds it)."""
    bound = max(core.trivial_bound(), known_bound)
    if exact is not None and math.isfinite(exact.bound):
        bound = max(bound, exact.bound)
    if exact is not None and exact.status == OPTIMAL:
        return bound
    incumbent = min((core.cost(c) for c in candidates), default=math.inf)
    if not price_memory or (math.isfinite(incumbent) and incumbent - bound <= relative_gap * abs(incumbent)):
        return bound
    dual = memory_dual_bound(
        core,
        time_limit=max(0.1, deadline - time.perf_counter()),
        upper_bound=incumbent if math.isfinite(incumbent) else None,
    )
    return max(bound, dual)


def _use_pruned(core: CompactProblem) -> bool:
    """The pruned solve suits few nodes with many strategies each (plans on 3-D meshes); with thousands of
    nodes (the IOPDDL instances) its restricted program is itself too large, and the time goes to LNS."""
    return int((core.strategy_counts > 1).sum()) <= PRUNED_MAX_NODES


def _pruned(
    core: CompactProblem,
    engine: str,
    incumbent: np.ndarray,
    left: float,
    deadline: float,
    threads: int,
    relative_gap: float,
) -> Pruned:
    """`solver.large.pruned`: TRW-S for up to `PRUNED_TRWS_SHARE` of the time ``left`` after the reductions,
    then the program over each node's best strategies, whole, for up to `PRUNED_SOLVE_SHARE` (and never past
    ``deadline``)."""
    trws_deadline = min(deadline, time.perf_counter() + PRUNED_TRWS_SHARE * left)
    solve_deadline = min(deadline, trws_deadline + PRUNED_SOLVE_SHARE * left)

    def solve_restricted(restricted: CompactProblem, start: np.ndarray | None, deadline: float):
        result, _variables, _constraints = _solve_whole(
            restricted, engine, start, deadline, threads, lambda _c, _b: None, {}, relative_gap
        )
        return result.assignment

    return pruned_solve(core, incumbent, trws_deadline, solve_deadline, solve_restricted)


def _finish(
    problem: Problem,
    reduced: Reduced,
    core: CompactProblem,
    candidates: list[np.ndarray],
    exact: BackendResult | None,
    bound: float,
    backend: str,
    variables: int,
    constraints: int,
    tracker: _Tracker,
    timings: dict[str, float],
) -> SolveResult:
    seconds = time.perf_counter() - tracker.started
    best: tuple[float, np.ndarray, int] | None = None
    for assignment in candidates:
        original = reduced.lift(core.lift(assignment))
        evaluation = evaluate(problem, original)
        if evaluation.feasible and (best is None or evaluation.cost < best[0]):
            best = (evaluation.cost, original, evaluation.peak_usage)
    steps = [asdict(step) for step in reduced.steps]
    free = core.strategy_counts > 1
    size = {
        "nodes": problem.num_nodes,
        "edges": problem.num_edges,
        "strategies": int(problem.node_offsets[-1]),
        "reduced_strategies": int(reduced.problem.node_offsets[-1]),
        "free_super_nodes": int(free.sum()),
        "free_super_strategies": int(core.strategy_counts[free].sum()),
        "reduced_edges": int(sum(1 for a, b in core.edge_nodes.tolist() if free[a] and free[b])),
    }
    common = {
        "seconds": seconds,
        "first_solution_seconds": tracker.first_solution,
        "variables": variables,
        "constraints": constraints,
        "backend": backend,
        "usage_limit": problem.usage_limit,
        "reductions": steps,
        "timings": timings,
        "size": size,
    }
    if best is None:
        if exact is not None and exact.status == INFEASIBLE:
            raise _peak_error(core, time_limit=30.0)
        return SolveResult(None, None, NO_SOLUTION, _finite_or(bound, -math.inf), None, **common)  # type: ignore[arg-type]
    cost, original, peak = best
    if problem.is_integral and math.isfinite(bound):
        bound = math.ceil(bound - 1e-9 * max(1.0, abs(bound)))
    bound = min(bound, cost)
    proven = (
        exact is not None and exact.status == OPTIMAL and cost <= exact.objective + reduced.constant + 1e-9
    )
    closed = cost - bound <= (0.0 if problem.is_integral else ROUNDING_NOISE * max(1.0, abs(cost)))
    status = OPTIMAL if proven or closed else FEASIBLE
    if status == OPTIMAL:
        bound = cost
    gap = 0.0 if cost == bound else (cost - bound) / max(abs(cost), 1e-300)
    tracker.update("final", cost, bound)
    return SolveResult(original.tolist(), cost, status, bound, gap, peak_usage=peak, **common)  # type: ignore[arg-type]


def warm_up_kernels() -> None:
    """Compile (or load from numba's cache) the heuristic, reduction and bound kernels on a tiny problem."""
    warm_up()
    small = Problem.from_lists(
        costs=[[1.0, 2.0], [2.0, 1.0], [1.0, 2.0, 3.0]],
        usages=[[2, 1], [1, 2], [1, 1, 1]],
        intervals=[[0, 2], [1, 3], [0, 3]],
        edges=[[0, 1], [1, 2]],
        edge_costs=[[0.0, 3.0, 3.0, 0.0], [0.0, 1.0, 2.0, 1.0, 0.0, 2.0]],
        usage_limit=5,
    )
    reduce(small)  # strategy 2 of node 2 is dominated: every reduction kernel runs, before and after an edit
    tiny = compact(
        Problem.from_lists(
            costs=[[1.0, 2.0], [2.0, 1.0]],
            usages=[[2, 1], [1, 2]],
            intervals=[[0, 2], [1, 3]],
            edges=[[0, 1]],
            edge_costs=[[0.0, 3.0, 3.0, 0.0]],
            usage_limit=3,
        )
    )
    memory_dual_bound(tiny, time_limit=1.0, upper_bound=tiny.cost(np.zeros(2, dtype=np.int64)))


def _check_memory_possible(core: CompactProblem, explain: bool = True) -> None:
    """Refuse at once a limit below the peak that even each node's smallest usage reaches (``explain``: with
    the smallest peak an assignment reaches, a program of its own; else with that lower bound)."""
    if core.usage_limit is None:
        return
    bound = min_peak_lower_bound(core)
    if bound <= core.usage_limit:
        return
    raise _peak_error(core, time_limit=10.0) if explain else _limit_error(core, bound, exact=False)


def _peak_error(core: CompactProblem, time_limit: float) -> InfeasibleError:
    """The error for an infeasible problem, naming the smallest peak any assignment can reach."""
    try:
        peak, exact = smallest_peak(core, time_limit=time_limit)
    except InfeasibleError as error:
        if core.usage_limit is None or min_peak_lower_bound(core) <= core.usage_limit:
            return error
        # The peak program can fail on huge byte counts; the per-step bound alone proves the limit impossible.
        peak, exact = min_peak_lower_bound(core), False
    return _limit_error(core, peak, exact)


def _limit_error(core: CompactProblem, peak: int, exact: bool) -> InfeasibleError:
    """The error for a limit below ``peak`` (the smallest peak any assignment reaches, or at least)."""
    qualifier = "" if exact else "at least "
    return InfeasibleError(
        f"usage_limit {core.usage_limit} cannot be met: the smallest peak any assignment can reach is "
        f"{qualifier}{peak}",
        min_peak=peak,
        min_peak_exact=exact,
    )


def _heuristic_share(core: CompactProblem, mode: str) -> float:
    """The share of the time limit the heuristic gets before a backend takes over."""
    if mode == HEURISTIC:
        return 1.0
    if mode == LNS:
        return 0.1 if _use_pruned(core) else 0.5
    size = int(core.strategy_counts.sum())
    if size <= 2_000:
        return 0.02
    if size <= 50_000:
        return 0.1
    return 0.3


def _plan(core: CompactProblem, backend: str) -> tuple[str, str]:
    """(engine, mode): the whole program for a backend when it is small enough, else the heuristic (on every
    core) followed by large neighbourhood search with the backend (`auto`: HiGHS, measured best on both)."""
    if backend == HEURISTIC:
        return HEURISTIC, HEURISTIC
    small = program_size(core) <= FULL_PROGRAM_MAX_VARIABLES
    if backend == "auto":
        return "highs", FULL if small else LNS
    return backend, FULL if small else LNS


def program_size(core: CompactProblem) -> int:
    """Columns the integer program of `core` will have, before memory auxiliaries (x plus finite y)."""
    return program_shape(core)[0]


def program_shape(core: CompactProblem) -> tuple[int, int]:
    """(columns, rows) of the integer program of `core` before memory rows: x plus finite y; one-hot rows plus
    both marginal families of every edge between nodes with a choice."""
    free = core.strategy_counts > 1
    counts = core.strategy_counts
    columns, rows = int(counts[free].sum()), int(free.sum())
    for (a, b), m in zip(core.edge_nodes.tolist(), core.edge_costs, strict=True):
        if free[a] and free[b]:
            columns += int(np.isfinite(m).sum())
            rows += int(counts[a] + counts[b])
    return columns, rows


class _Stagnation:
    """Before a backend takes the whole program, the heuristic only needs a good warm start: it stops once it
    has gone `HEURISTIC_PATIENCE` times as long as its last improvement took (at least ``quiet`` seconds)
    without improving by `HEURISTIC_MIN_GAIN` or more."""

    def __init__(self, started: float, quiet: float) -> None:
        self.started = started
        self.last = started
        self.cost = math.inf
        self.quiet = quiet

    def improved(self, cost: float) -> None:
        if cost < self.cost - HEURISTIC_MIN_GAIN * abs(cost):
            self.last, self.cost = time.perf_counter(), cost

    def stalled(self) -> bool:
        now = time.perf_counter()
        return now - self.last > max(self.quiet, HEURISTIC_PATIENCE * (self.last - self.started))

    def quiet_now(self) -> bool:
        """No improvement for the last ``quiet`` seconds."""
        return time.perf_counter() - self.last > self.quiet


class _Tracker:
    """Best incumbent and bound seen so far, forwarded to the progress callback."""

    def __init__(self, started: float, callback: ProgressCallback | None) -> None:
        self.started = started
        self.callback = callback
        self.best = math.inf
        self.bound = -math.inf
        self.first_solution: float | None = None

    def incumbent(self, phase: str, cost: float) -> None:
        self.update(phase, cost, -math.inf)

    def update(self, phase: str, cost: float, bound: float) -> None:
        now = time.perf_counter() - self.started
        if math.isfinite(cost) and self.first_solution is None:
            self.first_solution = now
        improved = cost < self.best or bound > self.bound
        self.best = min(self.best, cost)
        self.bound = max(self.bound, bound)
        if self.callback is not None and (improved or phase == "final"):
            self.callback(phase, now, self.best, self.bound)


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


__all__ = ["FEASIBLE", "INFEASIBLE", "SolveResult", "solve"]
