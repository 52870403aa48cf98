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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from service.search.request import MIN_CANDIDATE_LIMIT_S

RESULTS_RESERVE_S = 1.5
"""Kept for after the last candidate: results.json, the plans, the CSV and report.html (llama3-8b on 64
devices, 48 plans: ~1 s)."""
FIRST_EXTRA_SHARE = 0.2
"""Before any candidate has finished, what a candidate costs beyond its limit is taken as this share of it."""
PRIOR_WEIGHT = 4
"""... and that guess counts as this many finished candidates in the mean after."""


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
    extra_s: list[float] = field(default_factory=list)

    @property
    def deadline(self) -> float:
        return self.started + self.budget_s - RESULTS_RESERVE_S

    def next_limit(self, now: float | None = None) -> float:
        """The limit of the next candidate to start (counted as started)."""
        now = time.perf_counter() if now is None else now
        left = max(0.0, self.deadline - now)
        waiting = max(1, self.candidates - self.started_count)
        running = self.started_count - self.finished_count
        share = left * self.workers / (waiting + running / 2)
        prior = FIRST_EXTRA_SHARE * share
        extra = (sum(self.extra_s) + PRIOR_WEIGHT * prior) / (len(self.extra_s) + PRIOR_WEIGHT)
        self.started_count += 1
        return round(min(self.ceiling_s, max(MIN_CANDIDATE_LIMIT_S, share - extra)), 2)

    def spent(self, now: float | None = None) -> bool:
        """Whether the deadline has passed: no candidate starts after it."""
        return (time.perf_counter() if now is None else now) >= self.deadline

    def finished(self, limit_s: float, seconds: float) -> None:
        """A candidate given ``limit_s`` ended after ``seconds``."""
        self.finished_count += 1
        self.extra_s.append(max(0.0, seconds - limit_s))


__all__ = ["FIRST_EXTRA_SHARE", "PRIOR_WEIGHT", "RESULTS_RESERVE_S", "BudgetShares"]
