"""The phases of a solve after the reductions, each over the one `SolveContext`, in the order `solver.solve`
runs them: the Lagrangian search, the heuristic, then the whole program or large neighbourhood search, then
the bound. (The memory-priced phases are in `solver.priced_phases`.)

Each phase reads what the ones before it left in the context (incumbent, candidates, known bound, budget)
and leaves its own there; timings go to ``run.timings`` under the phase's name.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np

from solver import policy
from solver.backends import get_backend
from solver.backends.base import OPTIMAL
from solver.bounds.lagrangian_branch import BranchResult, LagrangianBranch
from solver.bounds.memory_priced import memory_dual_bound
from solver.context import SolveContext, Stagnation
from solver.heuristics.anytime import HeuristicRun, warm_up
from solver.heuristics.portfolio import background_search, portfolio_solve
from solver.large.generated import GenerationGoal, generate_and_solve
from solver.large.lns import lns_improve
from solver.large.pruned import Pruned, pruned_solve, solve_over
from solver.large.regions import RegionSearch
from solver.parallel import can_fork
from solver.path import Mode, heuristic_share
from solver.priced_phases import peak_search, take_priced
from solver.whole import BackendSettings, begin_whole, restricted_solver, solve_whole

log = logging.getLogger(__name__)


def lagrangian_phase(run: SolveContext) -> bool:
    """With a memory limit and a gap to meet (`SolvePath.search_first`), the Lagrangian search
    (`lagrangian_search`) for up to `policy.LAGRANGIAN_SHARE` of the time left. True when the solve is over:
    its bound is past the caller's ``cutoff``, or its answer is proven within the gap, or final (then
    ``run.candidates``, ``run.bound``, ``run.label`` and the program's size are set for the result)."""
    if not run.path.search_first:
        return False
    budget, relative_gap = run.budget, run.options.relative_gap
    least = min(policy.LAGRANGIAN_MIN_S, policy.LAGRANGIAN_MIN_SHARE * budget.left)
    searched, final = lagrangian_search(run, budget.begun + max(least, policy.LAGRANGIAN_SHARE * budget.left))
    run.searched = searched
    if searched is None:
        return False
    run.known_bound = searched.bound
    run.tracker.update("lagrangian", searched.cost + run.constant, searched.bound + run.constant)
    cutoff = run.options.cutoff
    if cutoff is not None and run.known_bound + run.constant > cutoff:
        run.candidates = [] if searched.assignment is None else [searched.assignment]
        return _answered_by_search(run, run.known_bound + run.constant)
    if searched.assignment is None or not (final or searched.within(relative_gap)):
        return False
    run.candidates = [searched.assignment]
    phase = time.perf_counter()
    # Final but not proven: the bound is the whole LP's already; the memory-priced ascent stays below it.
    bound = lower_bound(run, not final) + run.constant
    run.timings["bound"] = time.perf_counter() - phase
    return _answered_by_search(run, bound)


def _answered_by_search(run: SolveContext, bound: float) -> bool:
    """The solve ends on the Lagrangian search's answer (``run.candidates``) with ``bound`` (the reductions'
    constant included); its size is the whole program's, which the certificate stands for (never built)."""
    run.bound = bound
    run.variables, run.constraints = run.path.columns, run.path.rows
    run.label = "lagrangian"
    return True


def lagrangian_search(run: SolveContext, deadline: float) -> tuple[BranchResult | None, bool]:
    """A certificate without the LP of the whole program (None where it does not apply: no edge, no memory
    limit, nothing feasible for TRW-S): `solver.bounds.lagrangian_branch` for the bound, until ``deadline``,
    then the program over the strategies it found promising (every decoding's, the root's best beliefs) -- a
    program of a few strategies per node. Where the search proved the gap, that program is solved whole by
    the backend to `policy.RESTRICTED_GAP_SHARE` of it for a better answer: on llama3-8b plans on 8x8 (8 to
    80 layers) the two took 0.1-0.6 s where the whole program's LPs took 2.5-7 s, with answers as good or
    better. Elsewhere, or where memory is *tight* (its price `policy.TIGHT_PRICE_SHARE` of the root's bound
    or more: the search stops at its root), and for programs of at most `policy.GENERATION_MAX_COLUMNS`,
    column generation from it (`solver.large.generated`) for up to `policy.RESTRICTED_SHARE` (tight:
    `policy.TIGHT_GENERATION_SHARE`) of the time left. (The result, and whether it is final: tight, and
    column generation converged, so its bound is the whole LP's, which nothing after it lifts, and its answer
    came from the search around the peak that the pipeline would run next.)"""
    core, relative_gap, timings = run.core, run.options.relative_gap, run.timings
    left, threads = run.budget.left, run.options.threads
    phase = time.perf_counter()
    try:
        search = LagrangianBranch(core)
    except ValueError:
        return None, False
    generation = run.path.columns <= policy.GENERATION_MAX_COLUMNS
    searched = search.run(
        relative_gap,
        deadline,
        give_up_gap=policy.LAGRANGIAN_GIVE_UP_GAP,
        root_only_share=policy.TIGHT_PRICE_SHARE if generation else math.inf,
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
    tight = search.memory_price_share >= policy.TIGHT_PRICE_SHARE
    if generation and (tight or not searched.within(relative_gap)):
        goal = GenerationGoal(
            deadline=phase + (policy.TIGHT_GENERATION_SHARE if tight else policy.RESTRICTED_SHARE) * left,
            relative_gap=relative_gap,
            threads=threads,
            polish_gap=policy.RESTRICTED_GAP_SHARE * relative_gap,
            polish=not tight,
            seed=run.options.seed,
            started=run.budget.started,
        )
        generated = generate_and_solve(core, search, keep, searched.assignment, searched.bound, goal)
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

    solver = restricted_solver(
        BackendSettings(run.path.backend, threads, policy.RESTRICTED_GAP_SHARE * relative_gap)
    )
    answer = solve_over(core, keep, searched.assignment, phase + policy.RESTRICTED_SHARE * left, solver)
    timings["restricted"] = time.perf_counter() - phase
    if answer is None or core.cost(answer) >= searched.cost:
        return searched, False
    cost = core.cost(answer)
    return dataclasses.replace(searched, assignment=answer, cost=cost, bound=min(searched.bound, cost)), False


def heuristic_phase(run: SolveContext) -> None:
    """`portfolio_solve` for its share of the work time (`solver.path.heuristic_share`, or the caller's):
    before a backend on the whole program it stops once stale, its backend's first work begun on the other
    core; in large neighbourhood search mode it goes on from its best answer on another core afterwards."""
    core, path, budget, options = run.core, run.path, run.budget, run.options
    relaxation_first = path.mode == Mode.FULL and get_backend(path.backend).separates_memory
    stagnation = Stagnation(time.perf_counter(), policy.HEURISTIC_QUIET_S[relaxation_first])
    first_work = (
        begin_whole(core, path.backend, budget.work_deadline, options.threads, run.timings)
        if path.whole
        else None
    )
    run.first_work = first_work
    phase = time.perf_counter()

    def on_incumbent(cost: float, _assignment: np.ndarray) -> None:
        stagnation.improved(cost)
        run.tracker.incumbent("heuristic", cost + run.constant)

    def stop_heuristic() -> bool:
        if first_work is None:
            return stagnation.stalled()
        # While the backend's first work runs on the other core, searching on costs nothing; after it, the
        # backend waits, so the heuristic stops once quiet (without the patience its late gains would earn).
        return first_work.done() and stagnation.quiet_now()

    share = options.heuristic_share if options.heuristic_share is not None else heuristic_share(core, path)
    least = min(policy.HEURISTIC_MIN_S, policy.HEURISTIC_MIN_SHARE * budget.left)
    seconds = max(least, share * (budget.work_deadline - time.perf_counter()))
    warm_up()
    heuristic = HeuristicRun(
        options.seed,
        on_incumbent=on_incumbent,
        stop=stop_heuristic if path.mode == Mode.FULL or path.priced_lns else None,
    )
    threads = 1 if path.mode == Mode.FULL else options.threads
    incumbent = portfolio_solve(core, seconds, threads, heuristic)
    run.timings["heuristic"] = time.perf_counter() - phase
    run.candidates = [] if incumbent is None else [incumbent]
    searched = run.searched
    if searched is not None and searched.assignment is not None:
        run.candidates.append(searched.assignment)
        if incumbent is None or searched.cost < core.cost(incumbent):
            incumbent = searched.assignment
    run.incumbent = incumbent

    # Large neighbourhood search takes one core; the heuristic goes on from its best answer on another until
    # the bound's deadline (on N its long descents are what find the cheap answers: 239e9 after half the work
    # time, 208e9 after all of it), and the search takes its answers whenever they are cheaper.
    run.background = (
        [
            background_search(
                core,
                budget.bound_deadline - time.perf_counter(),
                options.seed + options.threads,
                initial=incumbent,
            )
        ]
        if path.mode == Mode.LNS and options.threads > 1 and incumbent is not None and can_fork()
        else []
    )


def whole_phase(run: SolveContext) -> None:
    """The backend on the whole program (`solve_whole`, from the incumbent and the work begun before the
    heuristic); where memory binds, for `policy.PEAK_WHOLE_SHARE` of the work time, then, unless it proved its
    answer, the search around the peak from the best answer."""
    core, path, timings, budget = run.core, run.path, run.timings, run.budget
    phase = time.perf_counter()
    built_before = timings.get("build", 0.0)
    whole_deadline = phase + (policy.PEAK_WHOLE_SHARE if path.tight else 1.0) * (budget.work_deadline - phase)
    settings = BackendSettings(
        path.backend,
        run.options.threads,
        run.options.relative_gap,
        lambda cost, bound: run.tracker.update(path.backend, cost + run.constant, bound + run.constant),
    )
    exact, run.variables, run.constraints = solve_whole(
        core, settings, run.incumbent, whole_deadline, timings, run.first_work
    )
    run.exact = exact
    timings["backend"] = time.perf_counter() - phase - (timings["build"] - built_before)
    if exact.assignment is not None:
        run.candidates.append(exact.assignment)
    run.known_bound = max(run.known_bound, exact.bound)
    best_answer = min(run.candidates, key=core.cost) if run.candidates else None
    # T5 and ViT at half memory: HiGHS within 0.8% of its bound in 2 s, then the search ran out the whole
    # minute (issue 24): it stops once the gap asked for is proven, and does not start when it is.
    if path.tight and exact.status != OPTIMAL and best_answer is not None:
        phase = time.perf_counter()
        run.candidates.append(peak_search(run, best_answer, budget.work_deadline))
        timings["peak_lns"] = time.perf_counter() - phase


def lns_phase(run: SolveContext) -> None:
    """Too large for the whole program: the pruned solve (few nodes) or, where memory binds, the memory-priced
    phase, then large neighbourhood search (`solver.large.lns`) from the best answer while the gap is open,
    taking the background heuristic's answers when cheaper."""
    core, path, timings, budget = run.core, run.path, run.timings, run.budget
    threads = run.options.threads - len(run.background)
    assert run.incumbent is not None
    if path.pruned:
        phase = time.perf_counter()
        pruned = _pruned(run, threads)
        timings["pruned"] = time.perf_counter() - phase
        run.known_bound = max(run.known_bound, pruned.bound)
        if pruned.assignment is not None and core.cost(pruned.assignment) < core.cost(run.incumbent):
            run.incumbent = pruned.assignment
            run.candidates.append(run.incumbent)
            cost = core.cost(run.incumbent) + run.constant
            run.tracker.update("pruned", cost, run.known_bound + run.constant)
    elif path.priced_lns:
        # The memory-priced bound now rather than after the search (the time is the same), and where its
        # prices leave a program small enough to solve whole, that program first (M at 60 s: 49.95e9 where the
        # search alone reached 52.0-52.1e9; N, R, T, U: too large; S: small enough, too large once the cutting
        # planes' strategies join, so searched by regions).
        take_priced(run, threads, only_whole=True)
    best = core.cost(run.incumbent)
    if best - run.known_bound > run.options.relative_gap * abs(best):
        phase = time.perf_counter()
        search = RegionSearch(
            backend=path.backend,
            seed=run.options.seed,
            on_incumbent=run.report(f"{path.backend}-lns"),
            outside=lambda: read_background(run),
        )
        improved, _stats = lns_improve(core, run.incumbent, budget.work_deadline, search)
        timings["lns"] = time.perf_counter() - phase
        run.candidates.append(improved)


def _pruned(run: SolveContext, threads: int) -> Pruned:
    """`solver.large.pruned`: TRW-S for up to `policy.PRUNED_TRWS_SHARE` of the time left after the
    reductions, then the program over each node's best strategies, whole, for up to
    `policy.PRUNED_SOLVE_SHARE` (and never past the work deadline)."""
    assert run.incumbent is not None
    left, deadline = run.budget.left, run.budget.work_deadline
    trws_deadline = min(deadline, time.perf_counter() + policy.PRUNED_TRWS_SHARE * left)
    solve_deadline = min(deadline, trws_deadline + policy.PRUNED_SOLVE_SHARE * left)
    solver = restricted_solver(BackendSettings(run.path.backend, threads, run.options.relative_gap))
    return pruned_solve(run.core, run.incumbent, trws_deadline, solve_deadline, solver)


def read_background(run: SolveContext) -> tuple[float, np.ndarray] | None:
    """The cheapest new answer of the searches on other cores, reported; None when none came."""
    answers = [answer for answer in (search.poll() for search in run.background) if answer is not None]
    if not answers:
        return None
    best = min(answers, key=lambda answer: answer[0])
    run.tracker.incumbent("heuristic", best[0] + run.constant)
    return best


def bound_phase(run: SolveContext) -> None:
    """The bound (`lower_bound`, the memory-priced one unless a priced phase ran it), then the background
    searches stopped and their last answers taken."""
    phase = time.perf_counter()
    run.bound = lower_bound(run, "priced_bound" not in run.timings) + run.constant
    run.timings["bound"] = time.perf_counter() - phase
    for search in run.background:
        answer = search.stop()
        if answer is not None:
            run.tracker.incumbent("heuristic", answer[0] + run.constant)
            run.candidates.append(answer[1])
    run.label = run.path.label


def lower_bound(run: SolveContext, price_memory: bool = True) -> float:
    """The best proven bound on the compact problem: the backend's, else the Lagrangian dual bound with the
    memory limit priced in, until the bound's deadline (an incumbent's cost sizes its steps; not again when
    ``price_memory`` is False: the known bound holds it)."""
    core, exact, relative_gap = run.core, run.exact, run.options.relative_gap
    bound = max(core.trivial_bound(), run.known_bound)
    if exact is not None and math.isfinite(exact.bound):
        bound = max(bound, exact.bound)
    if exact is not None and exact.status == OPTIMAL:
        return bound
    incumbent = min((core.cost(c) for c in run.candidates), default=math.inf)
    if not price_memory or (math.isfinite(incumbent) and incumbent - bound <= relative_gap * abs(incumbent)):
        return bound
    dual = memory_dual_bound(
        core,
        time_limit=max(0.1, run.budget.bound_deadline - time.perf_counter()),
        upper_bound=incumbent if math.isfinite(incumbent) else None,
    )
    return max(bound, dual)
