"""The fast anytime heuristic: a feasible assignment in seconds, then steady improvement.

It works on a `CompactProblem`: minimise ``sum_k costs[k][s_k] + sum_(a,b) edge[a,b][s_a, s_b]`` subject to
every chosen cost finite and, at every time step, the summed usage of the live memory terms at most
``usage_limit``.

1. Contract functional edges (`solver.heuristics.contract`): a node whose strategy another one forces
   joins it. Exact, and it turns chains that must agree into single nodes.
2. Start from each node's least-usage strategy (the pointwise least usage profile: if it breaks the limit
   no assignment keeps it, and we return None), or from ``initial`` when it keeps the limit.
3. Local search: exact dynamic programming on a random tree around a root with every other node fixed
   (`solver.heuristics.kernels`): forbidden choices are counted and removed first, then the cost falls.
   Memory is a hard constraint: a tree node may only raise its usage within the slack of its interval.
   Moves that force the root off its strategy are accepted by late acceptance (the objective ``L``
   moves ago), which lets the search leave local optima.
4. Global targets: min-sum belief propagation on the whole graph with Lagrangian memory prices
   (`_Prices`, raised by subgradient steps where the target overloads). Each target is adopted node by
   node as far as the limit allows and the local search restarts from there; the last phase searches
   from the best assignment until the time is up.

The best violation-free state seen is verified, reported through ``on_incumbent`` and returned.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np

from solver.compact import CompactProblem, compact
from solver.heuristics.contract import Contraction, contract
from solver.heuristics.kernels import adopt, min_sum_bp, search_chunk, seed_rng
from solver.heuristics.state import (
    Flat,
    State,
    Work,
    flatten,
    min_usage_assignment,
    new_state,
    new_work,
    objective_parts,
    usage_points,
)
from solver.problem import Problem

#: Largest induced tree a move re-optimises, and the most work (multiply-adds) it may take.
MAX_TREE_NODES = 32
MAX_TREE_WORK = 200_000
#: Share of moves that force the root's strategy to change.
FORCED_SHARE = 0.5
#: Share of moves rooted at a node with a forbidden choice, while there are any.
FOCUS_SHARE = 0.5
#: Share of moves on a tree that is not induced (its DP is a heuristic, its result evaluated exactly).
NON_INDUCED_SHARE = 0.5
#: Memory pricing rounds (each a BP solve), BP sweeps per round, and the share of the time kept for search.
MAX_PRICE_ROUNDS = 20
BP_SWEEPS = 30
BP_DAMPING = 0.5
#: Subgradient step on the prices: the first one prices the overload at this share of the target's cost;
#: it grows while targets overload and shrinks once one has fitted.
PRICE_FIRST_STEP = 10.0
PRICE_GROWTH = 2.0
PRICE_SHRINK = 0.7
#: New priced targets are drawn in this share of the time limit; the rest searches on from the best of them.
PRICE_SHARE = 0.5
#: Late acceptance history length, and moves per call into the kernels.
HISTORY = 2_000
CHUNK_MOVES = 500
#: Kernel calls made before the clock is first read (so that even a tiny budget gets an answer).
FIRST_CHUNKS = 2
#: Kernel calls after each restart from a priced BP target.
RESTART_CHUNKS = 20
#: The last phase of a run ends once its best has not improved for as many kernel calls as it took to reach
#: it, and at least this many; the search starts again from the start on another seed (this far on).
STALL_CHUNKS = 3
RESTART_SEED_STRIDE = 7919


@dataclass(frozen=True)
class HeuristicRun:
    """How a heuristic search runs besides its problem and time limit."""

    seed: int = 0
    initial: np.ndarray | None = None
    """An assignment to start from where it fits (else each node's least usage)."""
    on_incumbent: Callable[[float, np.ndarray], None] | None = None
    """Told each better answer found: (its cost, the assignment)."""
    stop: Callable[[], bool] | None = None
    """Asked between chunks of work: True ends the search."""


def heuristic_solve(
    problem: CompactProblem, time_limit: float, run: HeuristicRun | None = None, searches: int = 1
) -> np.ndarray | None:
    """Best feasible super-node assignment found (finite cost, memory within limit), or None, the search
    run as ``run`` says (None: `HeuristicRun`'s defaults).

    ``searches``: independent searches (seeds ``seed``, ``seed + 1``, ...) taking turns chunk by chunk in
    this process, the best answer of all kept. Each seed ends in its own local optimum: on llama3-8b plans
    on 3-D meshes (2 s limits) the best of four seeds cost 9-28% less than the first alone, so on one core
    two searches at half speed beat one at full speed.
    """
    run = run or HeuristicRun()
    seed, initial, on_incumbent, stop = run.seed, run.initial, run.on_incumbent, run.stop
    deadline = time.monotonic() + time_limit
    if problem.num_nodes == 0:
        return np.zeros(0, dtype=np.int64)
    contraction = contract(problem)
    if contraction is None:
        return None
    flat = flatten(contraction.problem)
    start = min_usage_assignment(flat)
    if usage_points(flat, start).max(initial=0) > flat.limit:
        return None
    if initial is not None and np.shape(initial) == (problem.num_nodes,):
        restricted = contraction.restrict(np.asarray(initial, dtype=np.int64))
        if restricted is not None and _fits(flat, restricted):
            start = restricted
    incumbent = _Incumbent(contraction, on_incumbent)
    work = new_work(flat, MAX_TREE_NODES)
    pace = _Pace(work, deadline, stop)
    runs = [
        _search(
            _Search(flat, new_state(flat, start), incumbent),
            start,
            pace,
            seed + k,
            deadline - (1.0 - PRICE_SHARE) * time_limit,
        )
        for k in range(max(1, searches))
    ]
    while runs:  # in turns: each `next` is one kernel call of one search
        for turn in list(runs):
            try:
                next(turn)
            except StopIteration:
                runs.remove(turn)
    return incumbent.best


@dataclass(frozen=True)
class _Pace:
    """A search's kernel work space, its deadline (a `time.monotonic()` value) and who may stop it."""

    work: Work
    deadline: float
    stop: Callable[[], bool] | None = None

    def over(self) -> bool:
        return time.monotonic() >= self.deadline or (self.stop is not None and self.stop())


def _search(
    search: _Search, start: np.ndarray, pace: _Pace, seed: int, pricing_until: float
) -> Iterator[None]:
    """One search, a kernel call per step: the first calls, the priced targets (new ones until
    ``pricing_until``), then from its best until it stalls; then again on another seed from the start, until
    ``pace`` is over."""
    seed_rng(seed)
    rng = np.random.default_rng(seed)
    yield from search.chunks(_Pace(pace.work, math.inf), FIRST_CHUNKS)
    run = 0
    while True:
        prices = _Prices(search.flat)
        while not pace.over() and prices.rounds < MAX_PRICE_ROUNDS:
            target = prices.next_target(time.monotonic() < pricing_until)
            if target is None:
                break
            yield from search.restart_from(target, start, rng, pace)
        origin = search.best_contracted if run == 0 else search.state.assign
        if not (yield from search.restart_from(origin, start, rng, pace, forever=True)):
            return  # out of time (or stopped)
        run += 1  # stalled: again on another seed, from the start
        seed_rng(seed + RESTART_SEED_STRIDE * run)
        rng = np.random.default_rng(seed + RESTART_SEED_STRIDE * run)
        yield from search.restart_from(None, start, rng, pace, chunks=FIRST_CHUNKS)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel on a tiny problem, so that solves start at once."""
    problem = Problem.from_lists(
        costs=[[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]],
        usages=[[2, 1], [1, 2], [1, 1]],
        intervals=[[0, 2], [1, 3], [0, 3]],
        edges=[[0, 1], [1, 2]],
        edge_costs=[[0.0, 1.0, math.inf, 0.0], [1.0, 0.0, 0.0, 1.0]],
        usage_limit=4,
    )
    flat = flatten(compact(problem))
    start = min_usage_assignment(flat)
    state = new_state(flat, start)
    search = _Search(flat, state, _Incumbent(contract(compact(problem)), None))  # type: ignore[arg-type]
    for _ in search.chunks(_Pace(new_work(flat, MAX_TREE_NODES), math.inf), 1):
        pass
    target = _Prices(flat).next_target(True)
    adopt(flat, state, target, np.arange(len(start), dtype=np.int64))


class _Incumbent:
    """The best verified assignment of every search of one `heuristic_solve`, expanded; reported as found."""

    def __init__(self, contraction: Contraction, on_incumbent: Callable[[float, np.ndarray], None] | None):
        self.contraction = contraction
        self.on_incumbent = on_incumbent
        self.best: np.ndarray | None = None
        self.cost = np.inf

    def offer(self, cost: float, contracted: np.ndarray) -> None:
        if cost < self.cost:
            self.best, self.cost = self.contraction.expand(contracted), cost
            if self.on_incumbent is not None:
                self.on_incumbent(cost, self.best.copy())


class _Search:
    """Runs the kernels in chunks; keeps the late-acceptance history and its own verified best."""

    def __init__(self, flat: Flat, state: State, incumbent: _Incumbent):
        self.flat = flat
        self.state = state
        self.incumbent = incumbent
        self.best_contracted: np.ndarray | None = None
        self.best_cost = np.inf
        self.history = np.full(HISTORY, np.inf)
        self.params = np.array(
            [MAX_TREE_NODES, MAX_TREE_WORK, FORCED_SHARE, FOCUS_SHARE, NON_INDUCED_SHARE], dtype=np.float64
        )
        self._reset_history()

    def _objective(self) -> float:
        s = self.state
        return float(s.nviol[0] * self.flat.forb + s.finite[0] + s.price[0])

    def _reset_history(self) -> None:
        self.had_violations = bool(self.state.nviol[0] > 0)
        self.history[:] = self._objective()

    def chunks(self, pace: _Pace, count: int) -> Generator[None, None, bool]:
        """Up to ``count`` kernel calls (yielding after each), stopping when ``pace`` is over; with ``count``
        negative, until the state stalls: its best has not improved for as many calls as it took to reach
        it (at least `STALL_CHUNKS`). Returns True when it stopped for its count or a stall, False for the
        deadline or its ``stop``."""
        done = improved_at = 0
        best = self.state.best_cost[0]
        while done != count and not pace.over():
            s = self.state
            focus = _violating_nodes(self.flat, s.assign) if s.nviol[0] > 0 else np.zeros(0, np.int64)
            search_chunk(self.flat, s, pace.work, self.params, focus, self.history, CHUNK_MOVES)
            self._after_chunk()
            done += 1
            yield
            if self.state.best_cost[0] < best:
                best, improved_at = self.state.best_cost[0], done
            elif count < 0 and done - improved_at >= max(STALL_CHUNKS, improved_at):
                return True
        return done == count

    def restart_from(
        self,
        target: np.ndarray | None,
        start: np.ndarray,
        rng: np.random.Generator,
        pace: _Pace,
        forever: bool = False,
        chunks: int = RESTART_CHUNKS,
    ) -> Generator[None, None, bool]:
        """Search again from ``start`` moved towards ``target`` as far as the memory limit allows
        (``chunks`` kernel calls, or ``forever``: until it stalls); `chunks`'s answer."""
        state = new_state(self.flat, start)
        if target is not None:
            adopt(self.flat, state, target, rng.permutation(len(start)).astype(np.int64))
            state = new_state(self.flat, state.assign)
        self.state = state
        self._reset_history()
        return (yield from self.chunks(pace, -1 if forever else chunks))

    def _after_chunk(self) -> None:
        """Restart the history once feasible; verify and report a new best state."""
        if self.had_violations and self.state.nviol[0] == 0:
            self._reset_history()
        if self.state.best_cost[0] < self.best_cost:
            candidate = self.state.best.copy()
            nviol, cost = objective_parts(self.flat, candidate)
            if nviol == 0 and _fits(self.flat, candidate) and cost < self.best_cost:
                self.best_contracted, self.best_cost = candidate, cost
                self.incumbent.offer(cost, candidate)


class _Prices:
    """Lagrangian memory prices: ``lambda_p`` per time point, raised where a BP target overloads.

    The price of strategy ``s`` of a node is ``sum over its terms of usage[s] * sum_(p in term) lambda_p``;
    BP solves the priced problem without the limit. Each round is a projected subgradient step
    ``lambda_p = max(0, lambda_p + step * (load_p - limit) / limit)`` on the target's load.
    """

    def __init__(self, flat: Flat):
        self.flat = flat
        self.lam = np.zeros(flat.num_points)
        self.step = 0.0
        self.rounds = 0
        self.feasible_seen = False
        self.rev, self.moff = _message_layout(flat)
        self.term_node = np.repeat(np.arange(len(flat.ncount)), np.diff(flat.nterm_off))

    def next_target(self, may_raise: bool) -> np.ndarray | None:
        """BP's assignment under the current prices, then the prices raised; None once it fits."""
        if self.rounds >= MAX_PRICE_ROUNDS or (self.rounds > 0 and not may_raise):
            return None
        self._set_node_prices()
        target = min_sum_bp(self.flat, self.rev, self.moff, BP_SWEEPS, BP_DAMPING)
        self.flat.nprice[:] = 0.0
        self.rounds += 1
        load = usage_points(self.flat, target)
        gradient = (load - self.flat.limit) / max(self.flat.limit, 1)
        fits = not (gradient > 0).any()
        self.feasible_seen = self.feasible_seen or fits
        if self.step == 0.0:
            _, cost = objective_parts(self.flat, target)
            self.step = PRICE_FIRST_STEP * max(cost, 1.0) / max(float(np.maximum(gradient, 0) @ load), 1e-9)
        else:
            self.step *= PRICE_SHRINK if self.feasible_seen else PRICE_GROWTH
        self.lam = np.maximum(self.lam + self.step * gradient, 0.0)
        return target

    def _set_node_prices(self) -> None:
        f = self.flat
        prefix = np.concatenate([[0.0], np.cumsum(self.lam)])
        weight = prefix[f.thi] - prefix[f.tlo]
        prices = np.zeros(len(f.ncost))
        for q, v in enumerate(self.term_node.tolist()):
            if weight[q] > 0:
                count = f.ncount[v]
                prices[f.noff[v] : f.noff[v] + count] += weight[q] * f.tuse[f.tuoff[q] : f.tuoff[q] + count]
        f.nprice[:] = prices


def _message_layout(flat: Flat) -> tuple[np.ndarray, np.ndarray]:
    """For BP: the opposite adjacency entry of each entry, and where each entry's message starts."""
    owner = np.repeat(np.arange(len(flat.ncount)), np.diff(flat.adj_off))
    first = np.zeros(len(flat.ea), dtype=np.int64)
    second = np.zeros(len(flat.ea), dtype=np.int64)
    entries = np.arange(len(flat.adj_edge))
    is_first = flat.ea[flat.adj_edge] == owner
    first[flat.adj_edge[is_first]] = entries[is_first]
    second[flat.adj_edge[~is_first]] = entries[~is_first]
    rev = np.zeros(len(flat.adj_edge), dtype=np.int64)
    rev[first] = second
    rev[second] = first
    moff = np.concatenate([[0], np.cumsum(flat.ncount[owner])]).astype(np.int64)
    return rev, moff


def _fits(flat: Flat, assign: np.ndarray) -> bool:
    """True when ``assign`` is a valid index vector whose usage stays within the limit."""
    if assign.shape != flat.ncount.shape or (assign < 0).any() or (assign >= flat.ncount).any():
        return False
    return bool(usage_points(flat, assign).max(initial=0) <= flat.limit)


def _violating_nodes(flat: Flat, assign: np.ndarray) -> np.ndarray:
    """Nodes with a forbidden strategy or on an edge whose chosen pair is forbidden."""
    node_bad = flat.ncost[flat.noff[:-1] + assign] >= flat.forb
    edge_bad = flat.ecost[flat.eoff + assign[flat.ea] * flat.ncount[flat.eb] + assign[flat.eb]] >= flat.forb
    nodes = np.concatenate([np.flatnonzero(node_bad), flat.ea[edge_bad], flat.eb[edge_bad]])
    return np.unique(nodes).astype(np.int64)
