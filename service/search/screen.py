"""Which pipeline candidate a search plans next: fewest stages first, then the best twin without a pipeline.

A pipeline's candidate costs several micro-batch plans (8-15 s each on llama3-405b here) and a 4-axis search
has many of them (135 of the 172 candidates of llama3-405b on 16,384 devices with ``tp <= 8``): a budget of
minutes on two cores plans a few dozen, so their order decides which are planned at all. Every pipeline
``pp, dp, cp, tp = p x d x c x t`` has a twin without one, the 3-axis mesh ``dp, cp, tp = (p d) x c x t`` at
the same batch: the same devices, the same tensor and context parallelism, each device working through the
same tokens; the pipeline trades the twin's data-parallel collectives over ``p`` times more devices for
point-to-point sends and the schedule's idle time. The pipelines of a batch are planned in order of their
stages, fewest first, and among the same stages by their twin's planned step (a twin without a plan last).

Why stages first: in the full search of llama3-405b on 16,384 H100s (every candidate planned, 21.7 min), the
pipelines' steps were 0.96-2.1x their twin's at 2 stages (median 1.14) and 1.2-2.5x at 4-64 (the idle time a
schedule cannot hide once ``m`` micro-batches are limited by the batch per replica and the memory of ``p``
micro-batches in flight; smaller micro-batches less efficient; three outliers of 31-51x left aside), and 84 of
the 105 pipelines of 4-64 stages fit no schedule in 80 GiB. Ordered by twin and an ideal idle share
``(p - 1) / (v m)`` instead, the best pipeline was the 57th planned; by stages then twin, the 14th (26th in
the candidates' own order). ``benchmarks/README.md`` ("The 4-axis 405B search against a full one") has the
figures.

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

        def promise(index: int) -> tuple[int, bool, float, int]:
            found = self.twin_step(pending[index])
            return pending[index].mesh[0], found is None, found[0] if found else 0.0, index

        return pending.pop(min(options, key=promise))


__all__ = ["PipelineScreen", "twin"]
