"""The achieved-rate compute model (`strategies/cost/compute.py`) against the published figures it was fitted
to (`benchmarks/fit_hardware.py`), and its shape: tile and wave quantisation, split-K, causal attention."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from strategies.cost.compute import (
    ATTENTION,
    ATTENTION_BACKWARD,
    MATMUL,
    OTHER,
    compute_seconds,
    is_causal,
    matmul_efficiency,
    op_family,
)
from strategies.cost.hardware import PLAIN_ROOFLINE, PRESETS, HardwareError, override_hardware

aten = torch.ops.aten
H100 = PRESETS["h100"]


def kernel_tflops(flops: float, seconds: float) -> float:
    """A kernel alone: the step's sustained share and the launch floor taken out."""
    return flops / ((seconds - H100.launch_s) * H100.sustained_efficiency) / 1e12


def gemm_tflops(m: int, n: int, k: int) -> float:
    flops = 2.0 * m * n * k
    seconds = compute_seconds(
        H100,
        MATMUL,
        "bfloat16",
        np.array([flops]),
        np.array([2.0 * (m * k + k * n + m * n)]),
        np.array([[m, n]]),
    )[0]
    return kernel_tflops(flops, seconds)


@pytest.mark.parametrize(("n", "published"), [(4096, 716.0), (8192, 795.0)])
def test_square_gemms_run_near_cublas_published_rates(n: int, published: float) -> None:
    # cuBLAS bf16 on H100 SXM at 4096^3 and 8192^3 (pranjalssh/fast.cu README): 716 and 795 TFLOP/s
    assert gemm_tflops(n, n, n) == pytest.approx(published, rel=0.10)


def test_one_tile_past_a_full_wave_halves_the_rate() -> None:
    tile = H100.matmul_tile_m
    full = matmul_efficiency(H100, tile, tile * H100.sm_count, 8192)
    past = matmul_efficiency(H100, tile, tile * (H100.sm_count + 1), 8192)
    assert past / full == pytest.approx((H100.sm_count + 1) / (2 * H100.sm_count), rel=1e-9)


def test_a_single_tile_output_splits_its_long_reduction_over_every_multiprocessor() -> None:
    tile = H100.matmul_tile_m
    split = matmul_efficiency(H100, tile, tile, 512 * H100.sm_count)
    short = matmul_efficiency(H100, tile, tile, 512)
    assert split > 0.75 * H100.matmul_efficiency and short < 0.01


def attention_tflops(seq: int, causal: bool, backward: bool = False) -> float:
    batch, heads, dim = 16384 // seq, 16, 128  # FlashAttention's benchmark: 16k tokens, hidden 2048
    forward = 4.0 * batch * heads * seq * seq * dim
    flops = 2.5 * forward if backward else forward
    query = np.array([[batch, heads, seq, dim]])
    seconds = compute_seconds(
        H100, ATTENTION_BACKWARD if backward else ATTENTION, "bfloat16", np.array([flops]), np.array([0.0]),
        query_shape=query, causal=causal,
    )[0]  # fmt: skip
    return kernel_tflops(flops / 2 if causal else flops, seconds)


@pytest.mark.parametrize(
    ("seq", "causal", "backward", "published"),
    [
        (16384, False, False, 370),
        (16384, True, False, 335),
        (512, False, False, 309),
        (16384, False, True, 322),
    ],
)
def test_flash_attention_2_runs_at_its_published_rates(
    seq: int, causal: bool, backward: bool, published
) -> None:
    # FlashAttention-2 on H100, head dim 128 (the FA2 README benchmark and the FA3 paper's FA2 bars)
    assert attention_tflops(seq, causal, backward) == pytest.approx(published, rel=0.10)


def test_memory_bound_ops_run_at_the_achieved_copy_rate() -> None:
    moved = 2.0**30
    seconds = compute_seconds(H100, OTHER, "bfloat16", np.array([moved / 4]), np.array([moved]))[0]
    rate = moved / ((seconds - H100.launch_s) * H100.sustained_efficiency)
    assert rate == pytest.approx(H100.memory_bandwidth * H100.memory_efficiency, rel=1e-9)


def test_ops_are_sorted_into_families_and_causal_is_read_by_the_schema() -> None:
    assert op_family(aten.mm.default) == MATMUL and op_family(aten.bmm.default) == MATMUL
    assert op_family(aten._scaled_dot_product_flash_attention.default) == ATTENTION
    assert op_family(aten._scaled_dot_product_flash_attention_backward.default) == ATTENTION_BACKWARD
    assert op_family(aten._scaled_dot_product_flash_attention_for_cpu_backward.default) == ATTENTION_BACKWARD
    assert op_family(aten.add.Tensor) == OTHER
    efficient = aten._scaled_dot_product_efficient_attention.default  # (q, k, v, bias, log_sumexp, p, causal)
    assert not is_causal(efficient, (1, 2, 3, None, True, 0.0, False), {})
    assert is_causal(efficient, (1, 2, 3, None, True, 0.0, True), {})
    assert is_causal(aten._scaled_dot_product_flash_attention.default, (1, 2, 3, 0.0, True), {})


def test_a_plain_roofline_hardware_file_prices_the_peak_and_hides_nothing() -> None:
    plain = override_hardware({"base": "h100", **PLAIN_ROOFLINE})
    n = 8192
    seconds = compute_seconds(
        plain, MATMUL, "bfloat16", np.array([2.0 * n**3]), np.array([6.0 * n * n]), np.array([[n, n]])
    )[0]
    assert math.isclose(seconds, 2.0 * n**3 / plain.peak_flops["bfloat16"] + plain.launch_s, rel_tol=1e-12)
    assert plain.overlap_slowdown == 1.0


@pytest.mark.parametrize(
    ("figures", "field"),
    [
        ({"matmul_efficiency": 1.5}, "hardware.matmul_efficiency"),
        ({"sustained_efficiency": 0}, "hardware.sustained_efficiency"),
        ({"sm_count": 2.5}, "hardware.sm_count"),
        ({"overlap_slowdown": -0.1}, "hardware.overlap_slowdown"),
    ],
)
def test_bad_achieved_rates_in_a_hardware_file_are_refused_by_name(figures: dict, field: str) -> None:
    with pytest.raises(HardwareError, match=f"^{field}: "):
        override_hardware({"base": "h100", **figures})


def test_achieved_rates_from_a_file_replace_the_presets() -> None:
    hw = override_hardware({"base": "h100", "attention_efficiency": 0.65, "overlap_slowdown": 0})
    assert hw.attention_efficiency == 0.65 and hw.overlap_slowdown == 0.0
    assert hw.matmul_efficiency == H100.matmul_efficiency and hash(hw) != hash(H100)
