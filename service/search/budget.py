"""A search's wall budget, shared among its candidates as each one starts.

A solver limit fixed per candidate before the search (the budget's worker-seconds over the candidates) is a
guess at what the rest of a candidate costs (its problem build, the planner's passes, a solve running past
its limit) and at how many candidates end early, proven optimal: on a slower machine the guess ran the
64-device search 4-8 s past its 60 s budget. Here each candidate's limit is set when it is handed to a
worker, from what is left then:

    limit = clamp(left x workers / (waiting + running / 2) - extra,  MIN_CANDIDATE_LIMIT_S, time_limit_s)

``left``: the seconds until the deadline (the budget counted from the command's start, less
`RESULTS_RESERVE_S` for writing the results); ``waiting``: the candidates not started (this one included);
``running``: those started and not finished, counted as half a candidate each (on average half done);
``extra``: what a candidate has cost beyond its limit, the mean over those finished with `PRIOR_WEIGHT`
candidates' worth of `FIRST_EXTRA_SHARE` of the share beside them (the first two 3-D candidates of the
64-device search, planned while the next batch was captured beside them in a cold worker, ran 2.4-3.2 s past
their 1.85 s: their mean alone cut the next limits to the floor). Candidates ending early leave their time
to the rest, overruns are taken from the rest, spread over all of them rather than from the last. A
candidate's limit is therefore a function of when it starts; each plan records the limit it was given.

Overruns are counted by kind: a pipeline's candidate is several micro-batch plans, each a problem build, a
solve and a layer profile, and runs 8-15 s past its limit on llama3-405b where a mesh without a pipeline runs
1-3 s past; one mean for both starved the meshes and let pipelines start too late. A candidate starts only
when what is left covers its kind's measured overrun, the least limit and, with every worker busy (the
executor keeps one task queued), half a candidate's mean wall time for a worker to free up
(`BudgetShares.refusal`; asked again after a pipeline's captures), and its limit never reaches past the
deadline less that overrun; a candidate still planning at the deadline is stopped there
(:mod:`service.search.executors`): the budget is a bound on the search's wall, not on when its last candidate
starts (the 405B 4-axis search ended 51 s past a 270 s budget before; with the overruns by kind and no stop,
58 s past 290: pipelines of 1,024- and 2,048-device stages, planned last, ran 31-71 s on 0.5 s limits).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from service.search.candidates import Candidate
from service.search.request import MIN_CANDIDATE_LIMIT_S

RESULTS_RESERVE_S = 1.5
"""Kept for after the last candidate: results.json, the plans, the CSV and report.html (llama3-8b on 64
devices, 48 plans: ~1 s)."""
FIRST_EXTRA_SHARE = 0.2
"""Before any candidate has finished, what a candidate costs beyond its limit is taken as this share of it."""
PRIOR_WEIGHT = 4
"""... and that guess counts as this many finished candidates in the mean after."""
MESH, PIPELINE = "mesh", "pipeline"
"""The kinds of candidate whose overruns are counted apart."""


def kind_of(candidate: Candidate) -> str:
    return PIPELINE if candidate.pipelined else MESH


@dataclass
class BudgetShares:
    """The solver limits of a search's ``candidates`` under ``budget_s`` wall seconds from ``started`` (a
    ``time.perf_counter()`` reading), at most ``ceiling_s`` each, on ``workers`` workers."""

    budget_s: float
    candidates: int
    workers: int
    ceiling_s: float
    started: float = field(default_factory=time.perf_counter)
    started_count: int = 0
    finished_count: int = 0
    extra_s: dict[str, list[float]] = field(default_factory=dict)
    """What each finished candidate took beyond its limit, by kind."""
    seconds: list[float] = field(default_factory=list)
    """Each finished candidate's wall seconds."""

    @property
    def deadline(self) -> float:
        return self.started + self.budget_s - RESULTS_RESERVE_S

    def next_limit(self, now: float | None = None, kind: str = MESH) -> float:
        """The limit of the next candidate to start, of ``kind`` (counted as started)."""
        now = time.perf_counter() if now is None else now
        left = max(0.0, self.deadline - now)
        waiting = max(1, self.candidates - self.started_count)
        running = self.started_count - self.finished_count
        share = left * self.workers / (waiting + running / 2)
        seen = self.extra_s.get(kind, [])
        prior = FIRST_EXTRA_SHARE * share
        extra = (sum(seen) + PRIOR_WEIGHT * prior) / (len(seen) + PRIOR_WEIGHT)
        self.started_count += 1
        limit = min(share - extra, left - self.overrun_s(kind))
        return round(min(self.ceiling_s, max(MIN_CANDIDATE_LIMIT_S, limit)), 2)

    def overrun_s(self, kind: str, plans: int = 1) -> float:
        """The mean of what the finished candidates of ``kind`` took beyond their limits; before any, that of
        every kind finished times ``plans`` (a pipeline: its micro-batch plans, each a candidate's build and
        solve); 0 before any at all."""
        seen = self.extra_s.get(kind)
        if seen:
            return sum(seen) / len(seen)
        every = [extra for extras in self.extra_s.values() for extra in extras]
        return plans * sum(every) / len(every) if every else 0.0

    def refusal(self, kind: str, now: float | None = None, plans: int = 1) -> str | None:
        """Why a candidate of ``kind`` (of ``plans`` plans) may not start now, or None: the deadline has
        passed, or what is left is less than the least limit, its kind's overrun (`overrun_s`) and, with every
        worker busy, the wait for one."""
        now = time.perf_counter() if now is None else now
        if self.spent(now):
            return "not planned: the budget was spent before it could start"
        left = self.deadline - now
        busy = self.started_count - self.finished_count >= self.workers
        wait = sum(self.seconds) / len(self.seconds) / 2 if busy and self.seconds else 0.0
        overrun = self.overrun_s(kind, plans)
        if left >= MIN_CANDIDATE_LIMIT_S + overrun + wait:
            return None
        queued = f", and {wait:.1f} s to wait for a worker" if wait else ""
        return (
            f"not planned: a {kind} candidate is expected to take {overrun:.1f} s past its solver's limit"
            f"{queued}; {left:.1f} s of the budget were left"
        )

    def spent(self, now: float | None = None) -> bool:
        """Whether the deadline has passed: no candidate starts after it."""
        return (time.perf_counter() if now is None else now) >= self.deadline

    def passed_over(self) -> None:
        """A candidate that will not start (refused, or its capture failed): no longer waiting."""
        self.started_count += 1
        self.finished_count += 1

    def finished(self, limit_s: float, seconds: float, kind: str = MESH) -> None:
        """A candidate of ``kind`` given ``limit_s`` ended after ``seconds``."""
        self.finished_count += 1
        self.extra_s.setdefault(kind, []).append(max(0.0, seconds - limit_s))
        self.seconds.append(seconds)


__all__ = [
    "FIRST_EXTRA_SHARE", "MESH", "PIPELINE", "PRIOR_WEIGHT", "RESULTS_RESERVE_S", "BudgetShares", "kind_of",
]  # fmt: skip
