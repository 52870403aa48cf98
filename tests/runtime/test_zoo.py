"""The architectures people train plan, run and check (issue 24): a zoo of tiny ``transformers`` models in
training mode (dropout on) -- decoders (GPT-2, Llama, Qwen2, GPT-NeoX, Gemma, Phi-3), sliding-window
attention (Mistral, Gemma 2), mixture-of-experts (Mixtral, Qwen2-MoE), an encoder (BERT), an
encoder-decoder (T5) and a vision transformer (ViT): `user_models/zoo.py`.

Each is captured once and planned on a 2x2 (dp, tp) mesh twice: without a memory limit, and under half the
peak of keeping everything replicated (the ``ddp`` layout's), so the program must shard to fit. Both plans
run one step on the 4 shared gloo ranks with the check (loss and every gradient equal one process, every
parameter after the step), every op in its planned placements, the collectives DTensor ran exactly the
plan's, and no rank above the plan's predicted peak. Each rank, too, captures an architecture's step once
for both plans (`run_on_one_capture`), as the planner planned both from one capture.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from runtime.worker import RunOptions, run_rank
from strategies.plan.planner import PlanRequest, capture_request, plan_captured
from tests.strategies.models.user_models import zoo
from tests.strategies.models.user_models.zoo import ARCHITECTURES

ZOO = Path(__file__).resolve().parents[1] / "strategies" / "models" / "user_models" / "zoo.py"
BUDGETS = ("unconstrained", "half")
#: Solver seconds a plan may take here: what is tested is that the plan runs as planned, not how close to the
#: optimum it is (`benchmarks/zoo_plans.py` measures that, with the default limit).
TIME_LIMIT = 5.0


def request(architecture: str, **fields: object) -> PlanRequest:
    return PlanRequest(
        model=f"{ZOO}:{architecture}", mesh="2x2", axis_names="dp,tp", time_limit=TIME_LIMIT, **fields
    )


#: This rank's capture of the architecture it runs now, by model: one entry (the architectures run in turn).
_CAPTURES: dict[str, Any] = {}


def run_on_one_capture(options: RunOptions) -> dict[str, Any]:
    """`run_rank` (a rank job) with the architecture's training step captured on this rank once for both its
    plans: each plan is applied to a module built afresh from the seed, whose step is the same graph (its
    parameters are the graph's inputs; nothing applying a plan changes the graph)."""
    import strategies.graph.passes as passes

    capture = passes.capture_for_planning

    def captured_once(module: Any, inputs: Any, loss_fn: Any = None, compute_dtype: Any = None) -> Any:
        if options.model not in _CAPTURES:
            _CAPTURES.clear()
            _CAPTURES[options.model] = capture(module, inputs, loss_fn, compute_dtype)
        return _CAPTURES[options.model]

    passes.capture_for_planning = captured_once  # what `apply_plan` calls
    try:
        return run_rank(options)
    finally:
        passes.capture_for_planning = capture


@functools.cache
def plans(architecture: str) -> dict[str, dict]:
    """The architecture's plans by budget, from one capture; ``replicated``: the ddp layout's."""
    graph, _ = capture_request(request(architecture), None)
    replicated = plan_captured(request(architecture, baseline="ddp"), graph, None).plan
    limit = replicated["predicted"]["peak_memory_bytes"] / 2
    return {
        "replicated": replicated,
        "unconstrained": plan_captured(request(architecture), graph, None).plan,
        "half": plan_captured(request(architecture, memory_gib=limit / 2**30), graph, None).plan,
    }


def test_the_zoo_holds_a_dozen_architectures_each_a_factory() -> None:
    assert len(ARCHITECTURES) >= 12
    assert all(callable(getattr(zoo, name)) for name in ARCHITECTURES)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_architecture_plans_runs_as_planned_and_equals_one_process(
    ranks, tmp_path, architecture: str, budget: str
) -> None:
    by_budget = plans(architecture)
    plan = by_budget[budget]
    if budget == "half":
        limit = by_budget["replicated"]["predicted"]["peak_memory_bytes"] / 2
        assert plan["predicted"]["peak_memory_bytes"] <= limit
    path = tmp_path / f"{architecture}-{budget}.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    reports = ranks.run(
        run_on_one_capture, RunOptions(model=f"{ZOO}:{architecture}", plan=str(path), check=True)
    )
    for rank, report in enumerate(reports):
        assert isinstance(report, dict), f"rank {rank}: {report}"
    report = reports[0]
    assert report["checked"]
    assert report["deviations"] == []
    collectives = report["collectives"]
    assert collectives["measured"] == collectives["expected_on_backend"], collectives
    assert all(r["loss"] == report["loss"] for r in reports)
    memory = report["memory"]
    assert 0 < max(memory["peak_bytes_per_rank"]) <= 1.1 * memory["predicted_peak_bytes"], memory
