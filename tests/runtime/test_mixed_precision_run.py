"""Mixed precision on 4 gloo ranks: fp32 parameters, gradients and AdamW state, bf16 compute copies
(``--param-dtype float32 --compute-dtype bfloat16``). The planned step equals one process computing on the
same bf16 copies (`run_rank`'s check, within bf16's tolerance), with the planned collectives and a peak
within 110% of the predicted one."""

from __future__ import annotations

import pytest

from strategies.plan.planner import PlanRequest, plan_model
from tests.runtime.checked_run import assert_as_planned, run_checked
from tests.runtime.test_planned_step import GPT, HF_LLAMA

CASES = {
    "gpt-2x2": {"model": "gpt2-small", "batch": 8, "seq": 32, "layers": 2, "options": GPT, "mesh": "2x2"},
    "gpt-fsdp-full": {
        "model": "gpt2-small",
        **{"batch": 8, "seq": 32, "layers": 2, "options": GPT, "mesh": "4"},
        **{"baseline": "fsdp", "recompute": "full"},
    },
    "llama-2x2": {"model": HF_LLAMA, "mesh": "2x2"},
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_parameters_with_bf16_compute_run_as_planned(ranks, tmp_path, case) -> None:
    fields = CASES[case]
    plan = plan_model(PlanRequest(dtype="float32", compute_dtype="bfloat16", time_limit=20, **fields)).plan
    assert plan["request"]["compute_dtype"] == "bfloat16"
    assert_as_planned(run_checked(ranks, plan, fields["model"], tmp_path / "plan.json"))
