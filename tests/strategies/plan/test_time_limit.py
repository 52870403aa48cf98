"""``time_limit`` bounds the planner's solve phase: the passes after the first solve (recomputation where
memory binds, the headroom pass) run only in what is left of it."""

from __future__ import annotations

from strategies.plan.planner import PlanRequest, plan_model

TINY_GPT = {"dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 256, "vocab_size": 256}


def _plan(time_limit: float, memory_gib: float | None) -> tuple[dict, list[str]]:
    said: list[str] = []
    request = PlanRequest(
        model="gpt2-small",
        mesh="1",
        batch=8,
        seq=64,
        options=TINY_GPT,
        recompute="auto",
        memory_gib=memory_gib,
        time_limit=time_limit,
    )
    return plan_model(request, said.append).plan, said


def test_memory_binding_plans_try_recomputation_only_with_time_left_for_it() -> None:
    free, _ = _plan(60, None)
    peak = free["predicted"]["peak_memory_bytes"]
    budget = peak / 0.95 / 2**30  # the plan without recomputation fits, at 95% of the budget: memory binds

    _, said = _plan(60, budget)
    assert "memory binds: planning with activation recomputation" in said

    short, said = _plan(0.5, budget)
    assert not any(line.startswith("memory binds: planning") for line in said)
    assert any("no plan with recomputation" in line for line in said)
    assert short["predicted"]["peak_memory_bytes"] == peak  # the first solve's plan is the answer
    assert short["recompute"] == [] and short["predicted"]["recompute_s"] == 0


def test_the_headroom_pass_runs_only_where_the_limit_leaves_it_its_time() -> None:
    # the data-parallel MLP at 55% of a 1 GiB budget (test_planner): with 60 s the pass runs; with 0.5 s,
    # less than its 1 s floor is left, and the time-optimal plan is the answer
    def plan(time_limit: float) -> dict:
        request = PlanRequest(model="mlp", mesh="4", batch=65536, memory_gib=1.0, time_limit=time_limit)
        return plan_model(request).plan

    assert "fastest" in plan(60)["predicted"]
    assert "fastest" not in plan(0.5)["predicted"]
