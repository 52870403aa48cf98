"""Headroom: of the answers proven within the gap, one whose peak is small.

The program: ``min_x peak(x)`` subject to ``cost(x) <= cap``, where ``cap = bound / (1 - gap)`` and ``bound``
is the time-optimal solve's proven lower bound: every answer under the cap is proven within ``gap`` by that
same bound, so the plan's certificate stands. Memory is only a constraint of the time-optimal program, and
among the plans within 1% of the fastest (data parallelism that replicates its optimizer state or shards it
costs about the same time) it takes whichever it meets first; this pass prefers the one that leaves memory
for a larger batch.

Solved by probing memory limits with `solve` (the whole pipeline under limit ``L``: the least cost that fits
``L``, within the gap): an answer under the cap lowers the best peak to its own; an answer above it, or none
that fits, raises the floor to ``L``. The probes descend from the top: the first at `FIRST_PROBE_SHARE` of
the fastest answer's peak (the cap is tight, so what it allows lies just below), then, while no floor is
known, at `DESCENT_SHARE` of the best peak, then halfway between the floor and the best peak; at most
`MAX_PROBES`, within the time given, while the best peak is more than `PEAK_TOLERANCE` above the floor and
the best answer has used less than `ROOM_USED` of the room under the cap, and never with less time left than
the last probe took (a probe given less time than it needs ends worse, below). Each probe is told the cap:
once its memory-aware bound proves that nothing under the limit costs less, it stops (llama3-8b 8x8: a
probe under 32.6 GiB took 0.77 s to end above the cap, its bound above it after 0.27 s).
llama3-8b, batch 16 x 8192 on 8 devices (dp): the fastest plan peaks at 221 GiB, one 0.08% slower at 162 GiB
(the smallest peak any plan reaches is 147.2 GiB); on 8x8 (dp, tp): 39.1 GiB, and 36.9 GiB at +0.94%.
The pass is bounded by its time, and a probe given little time may end worse than one given more (the solve
splits its limit among its phases: llama3-8b on 8x8 under 37.2 GiB ended at +0.88% of the fastest cost in
~1 s when given 10-60 s, at +2.1% in 2.9-4.8 s when given 3-5 s, and, given 10 s again in another process,
at +1.04% in 7.7 s: the tight solve's time varies run to run). A probe is a heuristic answer, not a proof:
a solve that stops within its gap above the cap may have missed an answer under it, so the peak found is an
upper bound of the program's optimum.

The objective is a model of the step: a caller with a truer measure of a plan (the planner simulates each
answer's schedule, and an answer the objective rates within the gap can simulate several percent slower when
its collectives hide less than the credit it was solved with assumed) passes ``accept``; a probe's answer it
refuses counts as one above the cap.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from solver.errors import InfeasibleError
from solver.problem import Problem
from solver.solve import SolveOptions, SolveResult, solve

#: Probes (solves under a memory limit) at most.
MAX_PROBES = 4
#: Stop once an answer has used this share of the room between the fastest cost and the cap.
ROOM_USED = 0.8
#: Stop once the best peak is within this share of the floor (a tighter limit could win little).
PEAK_TOLERANCE = 0.05
#: The first probe's limit, as a share of the fastest answer's peak; then, until a probe fails, as a share
#: of the best peak so far.
FIRST_PROBE_SHARE = 0.95
DESCENT_SHARE = 0.8


@dataclass(frozen=True)
class Headroom:
    """What the pass found: the answer it keeps (the starting one when no probe beat it), the starting
    answer's cost and peak, the probes it ran and the seconds it took."""

    result: SolveResult
    fastest_cost: float
    fastest_peak: int
    probes: int
    seconds: float


def with_headroom(
    problem: Problem,
    fastest: SolveResult,
    options: SolveOptions,
    accept: Callable[[SolveResult], bool] | None = None,
) -> Headroom:
    """The answer of least peak found under the cap (module docstring), starting from ``fastest`` (a solve
    of ``problem`` with a solution and its peak), within ``options.time_limit`` seconds (each probe gets what
    is left of them) on ``options.backend`` and ``options.threads``, the cap ``options.relative_gap`` above
    ``fastest``'s bound; ``accept``, where given, must also hold of an answer (module docstring). The result
    keeps ``fastest``'s bound and reports its own cost, peak and gap against it (``feasible`` unless its
    cost is the bound)."""
    relative_gap, time_limit, backend, threads = (
        options.relative_gap,
        options.time_limit,
        options.backend,
        options.threads,
    )
    started = time.perf_counter()
    deadline = started + time_limit
    if fastest.solution is None or fastest.cost is None or fastest.peak_usage is None:
        raise ValueError("headroom: the fastest solve has no answer to start from")
    cap = fastest.bound / (1.0 - relative_gap) if fastest.bound > 0 else fastest.bound
    cap = max(cap, fastest.cost)  # the fastest answer itself is always allowed
    best, best_peak = fastest, fastest.peak_usage
    floor, probes, last_probe_s = 0, 0, 0.0
    limit = int(best_peak * FIRST_PROBE_SHARE)
    while probes < MAX_PROBES and best_peak - floor > PEAK_TOLERANCE * best_peak:
        now = time.perf_counter()
        if now >= deadline or deadline - now < last_probe_s:
            break
        probes += 1
        try:
            probe = solve(
                problem.replace(usage_limit=limit),
                SolveOptions(
                    backend=backend,
                    time_limit=deadline - now,
                    threads=threads,
                    relative_gap=relative_gap,
                    cutoff=cap,
                ),
            )
        except InfeasibleError:
            probe = None
        last_probe_s = time.perf_counter() - now
        fits = probe is not None and probe.solution is not None and probe.cost is not None
        fits = fits and probe.cost <= cap and probe.peak_usage is not None and probe.peak_usage < best_peak
        if fits and (accept is None or accept(probe)):
            best, best_peak = probe, probe.peak_usage
            if probe.cost - fastest.cost >= ROOM_USED * (cap - fastest.cost):
                break  # a tighter limit would cost more than the little room left under the cap
        else:
            floor = limit
        limit = (floor + best_peak) // 2 if floor else int(best_peak * DESCENT_SHARE)
    if best is not fastest and best.cost is not None:
        gap = max((best.cost - fastest.bound) / abs(best.cost), 0.0) if best.cost else 0.0
        best = dataclasses.replace(
            best,
            bound=fastest.bound,
            gap=gap,
            status=fastest.status if gap <= 0.0 else "feasible",
            usage_limit=problem.usage_limit,
            seconds=fastest.seconds + time.perf_counter() - started,
        )
    return Headroom(best, fastest.cost, fastest.peak_usage, probes, time.perf_counter() - started)


__all__ = ["Headroom", "with_headroom"]
