"""The memory model of mixed precision against a hand count at full size: llama3-8b on an 8 x 8 mesh, fp32
parameters and a bf16 step (``autoshard plan --param-dtype float32 --compute-dtype bfloat16``), laid out as
FSDP x TP (``baseline="fsdp_tp"``) with full recomputation, captured short (4 of 32 layers; the plan stands
for all 32).

The batch (8) and sequence (128) are small on purpose: the activations then stay far below the gradients, so
the step's peak is where every gradient exists, at the very end of the backward, and every tensor alive there
has a weight's shape. (At batch 16 x 1024 the peak is at the loss, among the logits.) The hand count, per
device, from the model's dimensions:

- every weight matrix is cut 64 ways (FSDP's ``S(0)`` on the 8-way data axis, Megatron's ``S(0)``/``S(1)`` on
  the 8-way tensor axis), every norm weight 8 ways (replicated over the tensor axis);
- 4 B per element for the fp32 parameters, 8 for Adam's two fp32 moments and 4 for the fp32 gradients (all
  of them: the token embedding's, last, is the fp32 cast just made, the same bytes as the gradient it
  becomes);
- 2 B per element for the token embedding's bf16 gradient, not yet reduced over the data axis (each rank
  holds the whole vocabulary, cut 8 ways over the tensor axis only): the backward makes it in bf16 and its
  fp32 cast comes while it is still there;
- no bf16 compute copy: a layer's copy is last read by its layer's backward, which ran before, and the token
  embedding's only by the forward lookup (its backward reads the tokens, not the weight);
- the RoPE tables (an fp32 buffer of 2 x max_seq_len x head_dim, replicated) and the loss (one fp32 number).

After the step the bf16 gradient is gone: what stays is 16 B per parameter element, the tables and the loss,
which the model counts twice there (4 B more): the loss op's value and the replicated copy the loss sink holds
over the step's last position, though the loss is replicated already.
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.plan.plan_json import plan_profile
from strategies.plan.planner import PlanOutcome, PlanRequest, plan_model

LAYERS, DIM, HEADS, KV_HEADS, FFN, VOCAB, MAX_SEQ = 32, 4096, 32, 8, 14336, 128256, 8192
HEAD_DIM = DIM // HEADS
KV_DIM = KV_HEADS * HEAD_DIM
DP, TP = 8, 8

EMBEDDING = VOCAB * DIM
"""Elements of the token embedding, and of the (untied) output projection."""
MATRICES = 2 * EMBEDDING + LAYERS * (2 * DIM * DIM + 2 * KV_DIM * DIM + 3 * FFN * DIM)
"""wq and wo; wk and wv; w1, w2 and w3, per layer."""
NORMS = (2 * LAYERS + 1) * DIM
"""Two RMSNorm weights per layer and the final one."""
SHARD = MATRICES // (DP * TP) + NORMS // DP
"""Parameter elements per device."""

FP32, BF16, ADAM = 4, 2, 8
ROPE = FP32 * 2 * MAX_SEQ * HEAD_DIM
LOSS = FP32
AT_THE_PEAK = {
    "fp32 parameters": FP32 * SHARD,  # 502,007,808
    "Adam's two fp32 moments": ADAM * SHARD,  # 1,004,015,616
    "fp32 gradients": FP32 * SHARD,  # 502,007,808
    "the token embedding's bf16 gradient, unreduced over DP": BF16 * EMBEDDING // TP,  # 131,334,144
    "bf16 compute copies": 0,
    "the RoPE tables": ROPE,  # 8,388,608
    "the loss": LOSS,  # 4
}
AFTER_THE_STEP = {
    "fp32 parameters, Adam's moments and fp32 gradients": (FP32 + ADAM + FP32) * SHARD,  # 2,008,031,232
    "the RoPE tables": ROPE,
    "the loss, and its replicated copy in the loss sink": 2 * LOSS,
}


@pytest.fixture(scope="module")
def outcome() -> PlanOutcome:
    return plan_model(
        PlanRequest(
            model="llama3-8b",
            mesh="8x8",
            batch=8,
            seq=128,
            dtype="float32",
            compute_dtype="bfloat16",
            baseline="fsdp_tp",
            recompute="full",
            time_limit=60,
        )
    )


def test_the_hand_count_is_the_model_size() -> None:
    assert MATRICES + NORMS == 8_030_261_248  # Meta's llama3-8b
    # every dim the layout cuts divides evenly, so a shard is exactly 1/64 (1/8) of its tensor
    assert all(size % (DP * TP) == 0 for size in (VOCAB, DIM, KV_DIM, FFN))


def test_every_layer_takes_the_layout_the_hand_count_assumes(outcome: PlanOutcome) -> None:
    plan = outcome.plan
    assert plan["layers"] == {"captured": 4, "total": 32}
    placements = plan["parameters"]
    assert len(placements) == 2 + 9 * LAYERS + 1
    for name, spec in placements.items():
        if name.endswith("norm.weight"):
            assert spec == ["S(0)", "R"], name
        else:
            assert spec[0] == "S(0)" and spec[1] in ("S(0)", "S(1)"), name
    (embedding_backward,) = [n for n in plan["nodes"] if n["op"] == "aten.embedding_dense_backward.default"]
    assert embedding_backward["output"][0][1] == "S(1)"  # the whole vocabulary, the width cut over TP
    assert embedding_backward["output"][0][0] in ("R", "P")


def test_the_peak_is_the_hand_count(outcome: PlanOutcome) -> None:
    peak = sum(AT_THE_PEAK.values())
    assert peak == 2_147_753_988  # 2.0 GiB: 1.87 of fp32 weights, Adam and gradients, 0.12 of bf16 gradient
    assert outcome.plan["predicted"]["peak_memory_bytes"] == peak


def test_after_the_step_only_fp32_weights_adam_and_gradients_stay(outcome: PlanOutcome) -> None:
    _, live_bytes = plan_profile(outcome.built, np.asarray(outcome.result.solution))
    assert live_bytes[-1] == sum(AFTER_THE_STEP.values())
