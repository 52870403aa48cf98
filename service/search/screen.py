"""Which pipeline candidate a search plans next: fewest axes, then stages, then the best twin without one.

A pipeline's candidate costs several micro-batch plans (8-15 s each on llama3-405b here) and a 4-axis search
has many of them (135 of the 172 candidates of llama3-405b on 16,384 devices with ``tp <= 8``): a budget of
minutes on two cores plans a few dozen, so their order decides which are planned at all. Every pipeline
``pp, dp, cp, tp = p x d x c x t`` has a twin without one, the 3-axis mesh ``dp, cp, tp = (p d) x c x t`` at
the same batch: the same devices, the same tensor and context parallelism, each device working through the
same tokens; the pipeline trades the twin's data-parallel collectives over ``p`` times more devices for
point-to-point sends and the schedule's idle time. The pipelines of a batch are planned in order of their
axes (``pp, dp, tp`` before ``pp, dp, cp, tp``), then of their stages, fewest first, and among the same
stages by their twin's planned step (a twin without a plan last).

Why fewer axes first: a pipeline without context parallelism plans in a quarter of the time (its stage mesh
has an axis fewer: 1-8 s against 10-24 s for llama3-405b at a search's 3 s limits), so all of them cost a
5-minute search about a minute; and they hold the layout of published pipelined runs (Llama 3 405B: pp 16 x
dp 128 x tp 8), which the full search of llama3-405b on 16,384 H100s ranks first (9.57 s, against 10.53 s
for the best 4-axis pipeline and 10.97 s for the best mesh without one).

Why stages first: fewer stages, fewer micro-batch plans at larger sizes, fewer that fit no schedule.
Among the 4-axis pipelines this is a weak guide: in the full search of llama3-405b on 16,384 H100s the best
one has 8 stages and is the 68th of them in this order; no simple order tried (by twin, by twin and an ideal
idle share ``(p - 1) / (v m)``, ``tp`` 8 first) brings it before the 14th (``benchmarks/README.md``: "The
4-axis 405B search against a full one" and the fourth session's figures).

The order only decides what is planned first; nothing is pruned by it. A pipeline the budget leaves unplanned
says its twin's step in its row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from service.search.candidates import AXIS_ROLES, Candidate


def twin(candidate: Candidate) -> tuple[tuple[int, ...], int]:
    """The mesh (and batch) without a pipeline that a pipeline's candidate is judged by."""
    stages, data, *inner = candidate.mesh
    return (stages * data, *inner), candidate.batch


@dataclass
class PipelineScreen:
    """The steps of the plans without a pipeline finished so far, and the pipelines' estimates from them."""

    steps: dict[tuple[tuple[int, ...], int], float] = field(default_factory=dict)

    def seen(self, row: dict[str, Any]) -> None:
        step = row.get("step_time_s")
        if step is None or row["axis_names"] != list(AXIS_ROLES[len(row["mesh"])]) or row["pipeline"]:
            return
        self.steps[(tuple(row["mesh"]), row["batch"])] = float(step)

    def twin_step(self, candidate: Candidate) -> tuple[float, str] | None:
        """A pipeline's twin's planned step seconds and the twin named, or None without its plan."""
        mesh, batch = twin(candidate)
        step = self.steps.get((mesh, batch))
        if step is None:
            return None
        return step, f"{','.join(AXIS_ROLES[len(mesh)])} {'x'.join(map(str, mesh))}"

    def take_next(self, pending: list[Candidate]) -> Candidate:
        """Remove and return the candidate to start next from ``pending`` (in dispatch order): its first,
        unless that is a pipeline, then the pipeline of that batch first in the module docstring's order."""
        first = pending[0]
        if not first.pipelined:
            return pending.pop(0)
        options = [i for i, c in enumerate(pending) if c.pipelined and c.batch == first.batch]

        def promise(index: int) -> tuple[int, int, bool, float, int]:
            found = self.twin_step(pending[index])
            mesh = pending[index].mesh
            return len(mesh), mesh[0], found is None, found[0] if found else 0.0, index

        return pending.pop(min(options, key=promise))


__all__ = ["PipelineScreen", "twin"]
