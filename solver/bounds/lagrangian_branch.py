r"""A certificate without an LP: Lagrangian branch-and-bound over TRW-S, for memory-limited problems.

On plan problems the pairwise (local-polytope) LP is tight and TRW-S reaches its value in a tenth of a
second where the simplex needs seconds (llama3-8b on 8x8: 0.1 s vs 2.3 s, the same 869,986.71). A memory
limit is what makes those programs hard: the LP with the binding row mixes two placements of the tied
layers, and its bound is only proven after branching. Both steps have a cheap TRW-S counterpart:

- **Bound of a subproblem** (a box: some strategies forbidden): for any prices ``mu >= 0`` on the memory
  rows, ``L(mu) = min_x f(x) + mu . (usage(x) - limit)`` bounds the memory-feasible optimum from below, and
  TRW-S bounds ``L(mu)`` from below (`memory_priced._Lagrangian.certify`, forbidden strategies priced at a
  cap: a relaxation, so still a bound). ``mu`` is chosen by Kelley's cutting planes: each decoded
  assignment ``x_i`` gives ``L(mu) <= f(x_i) + mu . g_i`` (``g_i`` its usage over the limit per row), and
  the next ``mu`` maximises the minimum of those planes (a small LP over the rows some ``x_i`` violated).
  The model's maximum minus the best certified bound says how far the ascent still is from the dual
  optimum; it stops once that is below `CONVERGED`, or the subproblem is cut off.
- **Branching** on usage: the cheapest decoded assignments on both sides of the limit (one over, one
  within) differ at some nodes; at the node whose two strategies differ most in usage at the row the first
  one overflows most, one child keeps the strategies using at least as much there as the over-limit one's
  (its *heavy* ones), the other the rest. A usage split, not one strategy: plans have many strategies with
  the same memory, and forbidding one of them lets another take its place at the same bound.

Best-first search; a subproblem whose bound is within `CUTOFF_SHARE` of the requested gap below the best
answer is cut off (as `solver.backends.highs_relaxation.branch_on_relaxation` does: solving a child on instead
gives its decodings, better answers than the cut-off would keep); the search ends once the smallest open bound
is within the whole gap. Every decoded assignment that fits every memory row and uses no forbidden strategy is
an answer. The search also marks *promising* strategies -- every decoding's, and each node's best beliefs at
the root (`beliefs`: cost plus messages in, at the root's prices) -- for the caller to solve the program
over them exactly (`solver.phases.lagrangian_search`): where the relaxation is tight, an optimum of the
priced problem takes only those, and TRW-S's own decoding can miss it by a few percent.

Measured on llama3-8b plans (8x8 mesh, 80 GiB; this 2-core machine): 8 layers, memory not binding, root
only, 0.07 s (bound = the LP's 105,003.78); 80 layers, 5 subproblems, 18 evaluations, 0.45-0.6 s, bound
884,249 (HiGHS's LPs with the memory row and two children: 886,541 in 3-5 s); 4x4x4 (7.2M edge pairs), the
root alone, 4.1-4.5 s.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog

from solver.bounds.memory_priced import _Lagrangian
from solver.bounds.trws import _pass, _prepare_mapped
from solver.compact import CompactProblem

#: TRW-S passes without a gain of `PASS_TOLERANCE` (relative) after which an evaluation ends.
STALL_PASSES = 6
PASS_TOLERANCE = 1e-9
#: At most this many TRW-S passes per evaluation of one ``mu``.
MAX_PASSES = 400
#: At most this many evaluations of ``mu`` per subproblem.
MAX_EVALUATIONS = 16
#: A subproblem's ascent has converged when the cutting-plane model's maximum is within this share of the
#: best certified bound.
CONVERGED = 1e-6
#: Subproblems whose bound is within this share of the requested gap below the best answer are cut off.
CUTOFF_SHARE = 0.5
#: A gap this small (relative) is rounding: TRW-S's certified bounds keep a margin of ~1e-9 of the cost for
#: the floating-point sums behind them (`solver.solve` calls such answers optimal too).
ROUNDING_NOISE = 1e-8
#: At most this many subproblems are evaluated.
MAX_SUBPROBLEMS = 64
#: The search stops after this many subproblems in a row that neither found a cheaper answer nor raised the
#: smallest open bound by `PROGRESS_SHARE` of the gap: Gemma at half memory (2 layers) split on usage 16
#: times in 6 s for +0.002 on a 30.7 gap, where one side of each split kept the parent's bound; GPT-2 found
#: its proof after 4 such subproblems in a row, llama3-8b (80 layers on 8x8) after none.
STALL_SUBPROBLEMS = 6
PROGRESS_SHARE = 0.05


@dataclass
class BranchResult:
    """A proven lower bound on the memory-feasible optimum and the best answer decoded (None: none fits)."""

    bound: float
    assignment: np.ndarray | None
    cost: float
    subproblems: int
    evaluations: int
    integral: bool = False  # every cost an integer: a gap below 1 proves the answer optimal

    def within(self, relative_gap: float) -> bool:
        return self.assignment is not None and _within(self.cost, self.bound, relative_gap, self.integral)


def _within(cost: float, bound: float, relative_gap: float, integral: bool) -> bool:
    return cost - bound <= max(relative_gap * abs(cost), _closing(cost, integral))


def _closing(cost: float, integral: bool) -> float:
    """The difference between an answer and a bound that proves it optimal: below 1 for integral costs, else
    rounding noise (the certified bounds keep a margin of ~1e-9 of the cost,
    `memory_priced._Lagrangian.certify`)."""
    return 0.999 if integral else ROUNDING_NOISE * max(1.0, abs(cost))


@dataclass(order=True)
class _Subproblem:
    bound: float
    order: int
    forbidden: np.ndarray = field(compare=False)  # bool per flat position
    msg: np.ndarray = field(compare=False)
    mu: np.ndarray = field(compare=False)
    inherited: list[_Point] = field(default_factory=list, compare=False)  # the parent's decodings


@dataclass
class _Point:
    """A decoded assignment: its objective and its usage over the limit at every row."""

    local: np.ndarray
    cost: float
    over: np.ndarray

    @property
    def fits(self) -> bool:
        return bool((self.over <= 0).all()) and math.isfinite(self.cost)


@dataclass
class _Evaluation:
    bound: float
    points: list[_Point]
    mu: np.ndarray
    msg: np.ndarray
    first_bound: float  # at the subproblem's starting prices (the root's: none, the memory-free bound)


class LagrangianBranch:
    """The search's state over one `CompactProblem` (see the module docstring)."""

    def __init__(self, problem: CompactProblem) -> None:
        prepared = _prepare_mapped(problem)
        if prepared is None or prepared[1] is None or problem.usage_limit is None:
            raise ValueError("the Lagrangian search needs a feasible problem with edges and a memory limit")
        _, arrays, alive, new_id, costs = prepared
        self.problem = problem
        self.lag = _Lagrangian(problem, arrays, alive, new_id, costs)
        graph = self.lag.graph
        self.n = len(graph.node_off) - 1
        self.pos = np.empty(self.n, dtype=np.int64)
        self.pos[self.lag.order] = np.arange(self.n, dtype=np.int64)
        self.scratch = np.zeros(int(np.max(np.diff(graph.node_off))) * 2 + 2, dtype=np.float64)
        self.evaluations = 0
        base = np.concatenate([self.lag.kept_base, self.lag.iso_base])
        starts = self.lag.block_starts
        node_spread = np.maximum.reduceat(base, starts) - np.minimum.reduceat(base, starts)
        #: No two answers differ by more than this: it bounds the prices worth trying.
        self.cost_scale = float(node_spread.sum()) + self.lag.edge_spread + 1.0
        #: Flat positions of every strategy a decoding used, and those the root's beliefs rank best.
        self.promising = np.zeros(self.lag.total_flat, dtype=bool)
        #: The root's messages at its best prices (`run`), where `bound_at` starts TRW-S.
        self.root_messages = self.root().msg
        #: The root's bound without prices and at its best ones (`run`; nan before).
        self.memory_free_bound = self.root_bound = math.nan

    # ---------------------------------------------------------------------------------------- evaluation
    def _bound_at(
        self, mu: np.ndarray, msg: np.ndarray, forbidden: np.ndarray, deadline: float
    ) -> tuple[float, _Point]:
        """TRW-S from ``msg`` (updated in place) at prices ``mu`` until it stalls (or ``deadline``): the
        certified bound and the decoding."""
        lag = self.lag
        graph = lag.graph
        lag.forbidden = forbidden
        iso_cost = lag.set_costs(mu)
        best = -math.inf
        stall = 0
        forward = True
        for passes in range(MAX_PASSES):
            value = _pass(forward, lag.order, self.pos, *graph, msg, self.scratch)
            forward = not forward
            if value > best + PASS_TOLERANCE * abs(value):
                stall = 0
            else:
                stall += 1
            best = max(best, value)
            if passes % 2 == 1 and (stall >= STALL_PASSES or time.perf_counter() >= deadline):
                break  # after a backward pass: decoding runs forward
        bound = lag.certify(mu, False, self.pos, msg)  # prices again, the same way
        local = lag.decode(msg, self.pos, iso_cost, self.scratch)
        flat = lag.node_start + local
        cost = math.inf if forbidden[flat].any() else lag.original_cost(local)
        if math.isfinite(cost):
            self.promising[flat] = True
        over = lag.row_usage(local) - lag.row_limit
        self.evaluations += 1
        return bound, _Point(local, cost, over)

    def evaluate(
        self, sub: _Subproblem, cutoff: float, deadline: float, priced_enough: float = math.inf
    ) -> _Evaluation:
        """Kelley's ascent on ``mu`` for one subproblem, until converged, cut off, out of time, or once its
        prices have raised the bound by ``priced_enough`` of it over its starting prices' bound.

        The parent's decodings that the subproblem allows are cutting planes of its ``L`` too (each is one
        of its answers), so the ascent starts with them."""
        mu, msg = sub.mu.copy(), sub.msg.copy()
        points = [p for p in sub.inherited if not sub.forbidden[self.lag.node_start + p.local].any()]
        best_bound, best_mu, best_msg = -math.inf, mu.copy(), msg.copy()
        first_bound = math.nan
        for _ in range(MAX_EVALUATIONS):
            bound, point = self._bound_at(mu, msg, sub.forbidden, deadline)
            first_bound = bound if math.isnan(first_bound) else first_bound
            points.append(point)
            if bound > best_bound:
                best_bound, best_mu, best_msg = bound, mu.copy(), msg.copy()
            if best_bound >= cutoff or time.perf_counter() >= deadline:
                break
            if best_bound - first_bound >= priced_enough * abs(best_bound):
                break
            model = self._next_prices(points, best_bound, mu)
            if model is None or model[0] - best_bound <= CONVERGED * max(1.0, abs(best_bound)):
                break
            if np.allclose(model[1], mu, rtol=1e-9, atol=0.0):
                break  # the decoding at these prices cut nothing new off the model: the ascent is stuck
            mu = model[1]
        return _Evaluation(best_bound, points, best_mu, best_msg, first_bound)

    def _next_prices(
        self, points: list[_Point], best_bound: float, current: np.ndarray
    ) -> tuple[float, np.ndarray] | None:
        """The cutting-plane model's maximum and where it is (``max t`` s.t. ``t <= f_i + mu . g_i``) over
        the rows some decoding overflows or ``current`` prices; None when there are none (nothing to price)
        or the model cannot be solved."""
        finite = [p for p in points if math.isfinite(p.cost)]
        if not finite:
            return None
        rows = np.flatnonzero(np.any([p.over > 0 for p in finite], axis=0) | (current > 0))
        if len(rows) == 0:
            return None
        mu = np.zeros(self.lag.num_rows)
        unit = max(1.0, float(self.problem.usage_limit or 1))  # prices per limit, not per byte: well scaled
        over = np.array([p.over[rows] for p in finite]) / unit
        costs = np.array([p.cost for p in finite])
        # A budget for the sum of the prices (one budget, not a box per row: a decoding over the limit at
        # many steps is then priced at its worst one): at most 4x the prices so far, or, from none, enough
        # that the largest overflow seen costs more than any two answers differ by.
        largest = float(np.max(over, initial=0.0))
        budget = 4.0 * float(current[rows].sum()) * unit
        if largest > 0:
            budget = max(budget, 2.0 * self.cost_scale / largest)
        objective = np.zeros(len(rows) + 1)
        objective[0] = -1.0
        answer = linprog(
            objective,
            A_ub=np.vstack([np.hstack([np.ones((len(finite), 1)), -over]), np.r_[0.0, np.ones(len(rows))]]),
            b_ub=np.r_[costs, budget],
            bounds=[(None, None)] + [(0.0, None)] * len(rows),
            method="highs",
        )
        if answer.status != 0:
            return None
        mu[rows] = answer.x[1:] / unit
        return float(-answer.fun), mu

    def _mark_best_beliefs(self, evaluation: _Evaluation) -> None:
        """Add to `promising` each node's best beliefs at the root's best prices (`_Lagrangian.best_beliefs`):
        where the relaxation is tight, an optimum of the priced problem takes only those."""
        self.lag.forbidden = None
        self.promising |= self.lag.best_beliefs(evaluation.mu, evaluation.msg, evaluation.bound)

    def bound_at(self, mu: np.ndarray, deadline: float) -> tuple[float, np.ndarray | None, float]:
        """At prices ``mu`` (per byte over the limit, one per row of `row_times`) on the whole problem: the
        proven bound, TRW-S from the root's messages until it stalls (or ``deadline``); the decoded
        assignment and its cost when it fits (else None, inf). The decoding's strategies and each node's best
        beliefs there join `promising`."""
        messages = self.root_messages.copy()
        bound, point = self._bound_at(mu, messages, np.zeros(self.lag.total_flat, dtype=bool), deadline)
        self.lag.forbidden = None
        self.promising |= self.lag.best_beliefs(mu, messages, bound)
        if not point.fits:
            return bound, None, math.inf
        return bound, self.original(point.local), point.cost

    @property
    def memory_price_share(self) -> float:
        """How much of the root's bound the memory limit's prices make: (bound at the root's best prices -
        bound without any) / bound; nan before the root."""
        return (self.root_bound - self.memory_free_bound) / max(abs(self.root_bound), 1e-300)

    @property
    def row_times(self) -> np.ndarray:
        """The time step of each memory row the prices ``mu`` are on (`solver.ilp.memory_row_times`)."""
        return self.lag.row_times

    def promising_strategies(self) -> list[np.ndarray]:
        """Per node of the problem, the strategies (its own indices) marked `promising`, sorted."""
        return self.lag.per_node(self.promising)

    # ---------------------------------------------------------------------------------------- branching
    def split(self, points: list[_Point]) -> tuple[slice, np.ndarray] | None:
        """How to branch: a node's flat positions and which of them are its *heavy* strategies -- those using
        at least as much at the row the cheapest over-limit decoding overflows most as that decoding's
        strategy there. The node is where that decoding and the cheapest fitting one differ most in usage
        at that row. None without both kinds of decoding (or without a node that differs in usage).

        Splitting by usage rather than by one strategy matters: plans have many strategies with the same
        memory (placements differing on axes that hold no big tensor), and forbidding one of them lets
        another take its place at the same bound."""
        over = [p for p in points if not p.fits and math.isfinite(p.cost)]
        fits = [p for p in points if p.fits]
        if not over or not fits:
            return None
        heavy = min(over, key=lambda p: p.cost)
        light = min(fits, key=lambda p: p.cost)
        row = int(np.argmax(heavy.over))
        swing = self._usage_at(row, heavy.local) - self._usage_at(row, light.local)
        node = int(np.argmax(swing))
        if swing[node] <= 0:
            return None
        usage = self._strategy_usage(row, node)
        return self.flat(node), usage >= usage[heavy.local[node]]

    def _usage_at(self, row: int, local: np.ndarray) -> np.ndarray:
        """Per node: the usage over its minimum of its terms live at ``row``, under ``local``."""
        lag = self.lag
        live = (lag.term_first <= row) & (lag.term_stop > row)
        used = lag.entry_use[lag.term_entry_off + local[lag.term_node]] * live
        return np.bincount(lag.term_node, weights=used, minlength=self.problem.num_nodes)

    def _strategy_usage(self, row: int, node: int) -> np.ndarray:
        """Per alive strategy of ``node``: the usage over its minimum of its terms live at ``row``."""
        lag = self.lag
        terms = np.flatnonzero((lag.term_node == node) & (lag.term_first <= row) & (lag.term_stop > row))
        usage = np.zeros(int(lag.alive[node].sum()))
        for term in terms.tolist():
            start = lag.term_entry_off[term]
            usage += lag.entry_use[start : start + len(usage)]
        return usage

    def flat(self, node: int) -> slice:
        start = int(self.lag.node_start[node])
        return slice(start, start + int(self.lag.alive[node].sum()))

    def original(self, local: np.ndarray) -> np.ndarray:
        return self.lag.original_index[self.lag.node_start + local]

    def root(self) -> _Subproblem:
        graph = self.lag.graph
        return _Subproblem(
            -math.inf,
            0,
            np.zeros(self.lag.total_flat, dtype=bool),
            np.zeros(int(graph.slot_off[-1]), dtype=np.float64),
            np.zeros(self.lag.num_rows),
        )

    # ------------------------------------------------------------------------------------------- search
    def run(
        self,
        relative_gap: float,
        deadline: float,
        incumbent: np.ndarray | None = None,
        give_up_gap: float = math.inf,
        max_subproblems: int = MAX_SUBPROBLEMS,
        root_only_share: float = math.inf,
    ) -> BranchResult:
        """Best-first search (module docstring) until the best answer is proven within ``relative_gap``,
        ``max_subproblems`` are evaluated, or ``deadline``. ``give_up_gap``: stop after the root when its gap
        is beyond this share (TRW-S is not tight there, and branching on memory would not close it);
        ``root_only_share``: also when memory's price is at least this share of its bound
        (`memory_price_share`: the caller prices memory otherwise), the root's ascent ending as soon as it is
        (T5 at half memory: after 3 of its 10 evaluations, 0.7 of 3.1 s)."""
        problem = self.problem
        integral = all(_integral(c) for c in problem.costs) and all(_integral(m) for m in problem.edge_costs)
        best = np.asarray(incumbent, dtype=np.int64) if incumbent is not None else None
        best_cost = problem.cost(best) if best is not None else math.inf

        def offer(points: list[_Point]) -> None:
            nonlocal best, best_cost
            for point in points:
                if point.fits and point.cost < best_cost:
                    best, best_cost = self.original(point.local), point.cost

        def cutoff() -> float:
            if best is None:
                return math.inf
            return best_cost - max(
                CUTOFF_SHARE * relative_gap * abs(best_cost), _closing(best_cost, integral)
            )

        heap = [self.root()]
        settled = math.inf  # the smallest bound of the subproblems cut off or solved
        solved = stalled = 0
        floor, before = -math.inf, math.inf  # the smallest open bound and the best cost a subproblem ago
        while heap and solved < max_subproblems and time.perf_counter() < deadline:
            if best is not None and _within(best_cost, heap[0].bound, relative_gap, integral):
                break
            now_floor = min(heap[0].bound, settled)
            if solved > 1:
                progress = best_cost < before or now_floor - floor > PROGRESS_SHARE * (best_cost - floor)
                stalled = 0 if progress else stalled + 1
                if stalled >= STALL_SUBPROBLEMS:
                    break
            floor, before = now_floor, best_cost
            sub = heapq.heappop(heap)
            # At the root, ``root_only_share`` of memory's price is enough: the caller prices memory on.
            evaluation = self.evaluate(sub, cutoff(), deadline, root_only_share if solved == 0 else math.inf)
            solved += 1
            offer(evaluation.points)
            if solved == 1:
                self._mark_best_beliefs(evaluation)
                self.root_messages = evaluation.msg
                self.memory_free_bound, self.root_bound = evaluation.first_bound, evaluation.bound
            bound = max(sub.bound, evaluation.bound)
            if bound >= cutoff() or (best is not None and _within(best_cost, bound, 0.0, integral)):
                settled = min(settled, bound)  # cut off, or solved: its optimum is the best answer
                continue
            split = self.split(evaluation.points)
            hopeless = solved == 1 and (
                (best is not None and not _within(best_cost, bound, give_up_gap, integral))
                or self.memory_price_share >= root_only_share
            )
            if split is None or hopeless:  # no memory split explains the gap, or TRW-S is far from tight
                heapq.heappush(heap, _Subproblem(bound, 0, sub.forbidden, evaluation.msg, evaluation.mu))
                break
            block, heavy = split
            take = sub.forbidden.copy()
            take[block] |= ~heavy
            forbid = sub.forbidden.copy()
            forbid[block] |= heavy
            for order, forbidden in enumerate((take, forbid)):
                child = _Subproblem(
                    bound, 2 * solved + order, forbidden, evaluation.msg, evaluation.mu, evaluation.points
                )
                heapq.heappush(heap, child)
        bound = min(heap[0].bound if heap else math.inf, settled, best_cost)
        return BranchResult(bound, best, best_cost, solved, self.evaluations, integral)


def _integral(values: np.ndarray) -> bool:
    finite = values[np.isfinite(values)]
    return bool(np.all(finite == np.round(finite)))
