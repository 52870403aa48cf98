"""Solve a `Problem`: reductions, a heuristic incumbent, an exact backend, a certificate.

`solve` runs the phases in order over one `solver.context.SolveContext`, on the path `solver.path.choose_path`
picks from the compacted problem; the time shares are `solver.policy`'s. Modules:

- `solver.path`: which backend and mode, and which of the phases below run (`SolvePath`);
- `solver.context`: the options, the time budget, the tracker of the best cost and bound, the context;
- `solver.phases`: the Lagrangian search, the heuristic, the whole program, large neighbourhood search, the
  bound; `solver.priced_phases`: the memory-priced ones; `solver.whole`: a backend on a whole program;
- here: the reductions, the result (`SolveResult`, mapped back and re-costed), the infeasibility errors.

Pipeline: `reductions.reduce` -> `compact` (groups become super nodes) -> with a memory limit and a gap to
meet, first the Lagrangian search over TRW-S (`phases.lagrangian_search`: a bound without any LP), then the
program over the strategies it found promising:

- where the search proved the gap (llama3-8b plans), that program solved exactly to a share of the gap, for
  a better answer;
- where it did not, or where memory's price is a large share of its root's bound (`policy.TIGHT_PRICE_SHARE`:
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

- the whole program (`whole.solve_whole`): `ilp.build_program` with memory rows added lazily (only steps some
  assignment could overflow, then the steps an answer violates; HiGHS starts with none and separates the
  rows its LP solutions violate from the program's `MemoryProfile`) + a backend warm-started from the
  incumbent; where the memory limit binds somewhere (*tight*: some step some assignment could overflow),
  for `policy.PEAK_WHOLE_SHARE` of the work time, then, unless it proved its answer, large neighbourhood
  search around the peak (`solver.large.peak`); tight and larger than the search's largest region, no whole
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
whole: the phases after the reductions share the time left then (never less than `policy.MIN_LEFT_SHARE` of
it). The bound is the best proven lower bound (the backend's, TRW-S's, the memory-priced Lagrangian's, or
every node and edge at its cheapest entry). ``relative_gap`` lets every stage stop once its answer is proven
that close.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from solver import phases
from solver.backends import BACKEND_NAMES
from solver.backends.base import FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL
from solver.bounds.lagrangian_branch import ROUNDING_NOISE
from solver.bounds.memory_priced import memory_dual_bound
from solver.bounds.min_peak import min_peak_lower_bound, smallest_peak
from solver.compact import CompactProblem, compact
from solver.context import Budget, ProgressCallback, SolveContext, SolveOptions, Tracker
from solver.errors import InfeasibleError
from solver.evaluate import evaluate
from solver.heuristics.anytime import warm_up
from solver.path import Mode, choose_path
from solver.priced_phases import priced_first_phase
from solver.problem import Problem
from solver.reductions import reduce


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
    problem: Problem, options: SolveOptions | None = None, progress: ProgressCallback | None = None
) -> SolveResult:
    """Best assignment found within ``options.time_limit`` seconds, with a proven bound (``options``: None,
    the defaults of `SolveOptions`).

    ``options.relative_gap``: an exact backend may stop once its answer is proven within this share of the
    optimum. ``options.cutoff``: answers costing more are of no use to the caller (the headroom pass's cap):
    once the memory-aware bound proves that none costs less, the solve stops with what it has (its bound above
    ``cutoff``).

    Raises `InfeasibleError` when no assignment fits the memory limit (naming the smallest reachable peak;
    without ``options.explain_infeasible``, a limit below every node's smallest usage is refused with that
    bound alone, not the smallest peak's own program: a caller that tries another problem next has no use for
    it) or every strategy of some node is forbidden.
    """
    options = options or SolveOptions()
    if options.backend not in (*BACKEND_NAMES, "auto", "heuristic"):
        raise ValueError(f"unknown backend {options.backend!r}; choose cbc, highs, cpsat, heuristic or auto")
    run = _prepare(problem, options, progress)
    if phases.lagrangian_phase(run):
        return _finish(run)
    phases.heuristic_phase(run)
    if run.path.priced_first and run.incumbent is not None:
        priced_first_phase(run)
    if run.path.whole and time.perf_counter() < run.budget.work_deadline - 0.2:
        phases.whole_phase(run)
    elif run.first_work is not None:
        # No solver may run on when the next one starts (HiGHS shares one thread pool).
        run.first_work.result()
    elif run.path.mode == Mode.LNS and run.incumbent is not None:
        phases.lns_phase(run)
    phases.bound_phase(run)
    return _finish(run)


def _prepare(problem: Problem, options: SolveOptions, progress: ProgressCallback | None) -> SolveContext:
    """The reductions and the compaction (timed), the memory limit checked, the path chosen, the clock set."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    tracker = Tracker(started, progress)
    phase = time.perf_counter()
    reduced = reduce(problem) if options.use_reductions else reduce(problem, enabled=())
    timings["reductions"] = time.perf_counter() - phase
    phase = time.perf_counter()
    core = compact(reduced.problem)
    timings["compact"] = time.perf_counter() - phase
    _check_memory_possible(core, options.explain_infeasible)
    path = choose_path(core, options.backend, options.relative_gap)
    budget = Budget.after_reductions(started, options.time_limit, path)
    return SolveContext(problem, reduced, core, options, path, budget, tracker, timings)


def _finish(run: SolveContext) -> SolveResult:
    """The best candidate mapped back to the original problem and re-costed by the independent evaluator, with
    the bound, the status and the gap they prove."""
    problem, reduced, core, tracker = run.problem, run.reduced, run.core, run.tracker
    seconds = time.perf_counter() - tracker.started
    best: tuple[float, np.ndarray, int] | None = None
    for assignment in run.candidates:
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
        "variables": run.variables,
        "constraints": run.constraints,
        "backend": run.label,
        "usage_limit": problem.usage_limit,
        "reductions": steps,
        "timings": run.timings,
        "size": size,
    }
    exact, bound = run.exact, run.bound
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


def _finite_or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


__all__ = ["FEASIBLE", "INFEASIBLE", "SolveOptions", "SolveResult", "solve"]
