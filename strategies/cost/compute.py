"""Compute time of one op on its local shapes, as a GPU achieves it rather than at its peak.

Each op belongs to one family, and each family has its own achieved rate (the figures are the hardware's,
:class:`~strategies.cost.hardware.Hardware`, fitted to published measurements cited in its presets):

- **matmul** (``mm``, ``addmm``, ``bmm``, ``linear``, our two-operand ``einsum``, grouped GEMMs): the output
  is ``M x N`` (rows by the last dim), the reduction ``K = FLOPs / (2 M N)``. The kernel runs ``M x N``
  in tiles of ``matmul_tile_m x matmul_tile_n``, ``sm_count`` tiles at a time (a *wave*), so a GEMM whose
  last wave is partly empty, or whose edge tiles are partly padding, pays for the whole tiles and waves
  (tile and wave quantisation: why the small shards of wide tensor parallelism run further from peak). A
  short reduction spends a larger share of each tile's time loading and storing: the rate is scaled by
  ``K / (K + matmul_k_half)``. Large, well-shaped GEMMs reach ``matmul_efficiency`` of the dense peak::

      rate = peak(dtype) * matmul_efficiency * useful tiles / (waves * sm_count) * padding * K / (K + k_half)

- **attention** (the flash / efficient / cuDNN SDPA kernels, forward and backward): FLOPs from
  ``torch.utils.flop_counter`` count every query-key pair; a causal kernel skips the masked half, so half of
  them are priced. The rate grows with the sequence the kernel streams over (``S`` keys) and its head dim
  ``D``: ``peak * attention_efficiency * S / (S + attention_seq_half)`` (the backward with
  ``attention_backward_efficiency``), less off the head dim the kernels are tuned for (128) and for a causal
  mask (:func:`attention_efficiency`): flash kernels run at half rate or less on short sequences
  (FlashAttention-2/3 papers).
- **everything else** (pointwise, normalisation, reductions, copies, the optimizer): bound by the bytes they
  read and write at ``memory_bandwidth * memory_efficiency`` (what a copy achieves of the HBM's rate), or by
  their FLOPs at the peak of their dtype when that is slower.

Every op is at least ``launch_s`` (the floor of launching one kernel), and no op is faster than its bytes
at the achieved memory rate (the roofline's other side). A whole training step runs its kernels at
``sustained_efficiency`` of these rates (fitted to published training runs, not to kernel benchmarks).
All functions here are vectorised over an op's strategies: one call per op prices every placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from strategies.cost.hardware import Hardware

MATMUL = "matmul"
ATTENTION = "attention"
ATTENTION_BACKWARD = "attention_backward"
OTHER = "other"
FAMILIES = (MATMUL, ATTENTION, ATTENTION_BACKWARD, OTHER)

MATMUL_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "einsum", "addmv", "mv", "dot", "_grouped_mm"}
)
"""Op names (their overload packet's, without namespace) whose work is one GEMM or a batch of them."""
ATTENTION_OPS = frozenset(
    {
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    }
)
"""Fused attention kernels (their ``_backward`` forms are the attention backward family)."""

CAUSAL_RATE = 0.9
"""A causal flash kernel's rate against a non-causal one over half the keys: FlashAttention-2 on H100, causal
at ``S`` keys runs at 0.84-0.91 of non-causal at ``S / 2`` (FA2 README H100 forward, head dim 128, 1k-16k)."""
HEAD_DIM_EXPONENT = 0.2
"""Head dims 64 and 256 run at 0.87-0.88 of head dim 128's rate in FlashAttention-2 (H100 forward at 16k:
322 and 326 against 370 TFLOP/s; A100 forward+backward, head dim 64 against 128: 0.87): ``0.5 ** 0.2``."""
SPLIT_K_CHUNK = 512
"""The shortest reduction chunk a split-K GEMM gives one multiprocessor (cuBLAS's split-K heuristics)."""


def op_family(op: Any) -> str:
    """The family of an op (``aten.mm.default`` -> ``matmul``), by its overload packet's name."""
    packet = getattr(op, "overloadpacket", op)
    name = getattr(packet, "__name__", str(packet)).split(".")[-1]
    if name in MATMUL_OPS:
        return MATMUL
    if name in ATTENTION_OPS:
        return ATTENTION
    if name.endswith("_backward") and name.removesuffix("_backward") in ATTENTION_OPS:
        return ATTENTION_BACKWARD
    return OTHER


def matmul_efficiency(
    hardware: Hardware, rows: np.ndarray, cols: np.ndarray, depth: np.ndarray
) -> np.ndarray:
    """The share of the dense peak a GEMM with an ``rows x cols`` output and reduction ``depth`` reaches
    (arrays, one entry per strategy): tile and wave quantisation times the reduction's ramp. An output of
    fewer tiles than multiprocessors has its reduction split (split-K, in chunks of at least
    :data:`SPLIT_K_CHUNK`) so that more of them work, each on a shorter reduction."""
    rows = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    cols = np.maximum(np.asarray(cols, dtype=np.float64), 1.0)
    depth = np.maximum(np.asarray(depth, dtype=np.float64), 1.0)
    tile_m, tile_n = float(hardware.matmul_tile_m), float(hardware.matmul_tile_n)
    tiles_m, tiles_n = np.ceil(rows / tile_m), np.ceil(cols / tile_n)
    padding = rows * cols / (tiles_m * tile_m * tiles_n * tile_n)
    tiles = tiles_m * tiles_n
    split = np.maximum(1.0, np.minimum(np.floor(hardware.sm_count / tiles), np.floor(depth / SPLIT_K_CHUNK)))
    units = tiles * split
    waves = np.ceil(units / hardware.sm_count)
    occupancy = units / (waves * hardware.sm_count)
    chunk = depth / split
    ramp = chunk / (chunk + hardware.matmul_k_half)
    return hardware.matmul_efficiency * padding * occupancy * ramp


def attention_efficiency(
    hardware: Hardware, keys: np.ndarray, head_dim: np.ndarray, backward: bool, causal: bool = False
) -> np.ndarray:
    """The share of the dense peak a flash attention kernel reaches over ``keys`` keys at ``head_dim``
    (FLOPs counted as the kernel does them: a causal kernel's half). A causal kernel runs as a non-causal
    one over half the keys, at :data:`CAUSAL_RATE` of its rate (the masked diagonal blocks); a head dim off
    the one the kernels are tuned for runs at ``ratio ** HEAD_DIM_EXPONENT`` of the rate (ratio at most 1)."""
    keys = np.maximum(np.asarray(keys, dtype=np.float64), 1.0)
    head_dim = np.maximum(np.asarray(head_dim, dtype=np.float64), 1.0)
    top = hardware.attention_backward_efficiency if backward else hardware.attention_efficiency
    if causal:
        keys, top = keys / 2.0, top * CAUSAL_RATE
    tuned = float(hardware.attention_head_dim)
    off_tune = np.minimum(head_dim / tuned, tuned / head_dim) ** HEAD_DIM_EXPONENT
    return top * keys / (keys + hardware.attention_seq_half) * off_tune


def compute_seconds(
    hardware: Hardware,
    family: str,
    dtype: str,
    flops: np.ndarray,
    moved_bytes: np.ndarray,
    output_shape: np.ndarray | None = None,
    query_shape: np.ndarray | None = None,
    causal: bool = False,
) -> np.ndarray:
    """Seconds per strategy of one op: ``flops`` (as counted, every query-key pair for attention) and
    ``moved_bytes`` read and written, per strategy; ``output_shape`` ``[strategy, dims]`` (matmul) or
    ``query_shape`` ``[strategy, (batch, heads, L, D)]`` (attention) the local shapes that set the rate."""
    flops = np.asarray(flops, dtype=np.float64)
    moved = np.asarray(moved_bytes, dtype=np.float64)
    peak = hardware.flops_for(dtype)
    memory_s = moved / (hardware.memory_bandwidth * hardware.memory_efficiency)
    if family == MATMUL and output_shape is not None and output_shape.shape[1] >= 1:
        elements = np.maximum(output_shape.prod(axis=1).astype(np.float64), 1.0)
        cols = output_shape[:, -1].astype(np.float64)
        rows = elements / np.maximum(cols, 1.0)
        depth = flops / (2.0 * elements)
        flops_s = flops / (peak * matmul_efficiency(hardware, rows, cols, depth))
    elif family in (ATTENTION, ATTENTION_BACKWARD) and query_shape is not None and query_shape.shape[1] == 4:
        work = flops / 2.0 if causal else flops
        efficiency = attention_efficiency(
            hardware,
            query_shape[:, 2],
            query_shape[:, 3],
            backward=family == ATTENTION_BACKWARD,
            causal=causal,
        )
        flops_s = work / (peak * efficiency)
    else:
        flops_s = flops / peak
    return np.maximum(flops_s, memory_s) / hardware.sustained_efficiency + hardware.launch_s


def is_causal(op: Any, args: tuple, kwargs: Mapping[str, Any]) -> bool:
    """Whether an attention call masks the upper triangle: its ``is_causal`` argument, found by the op's
    schema (positional in most calls, and at a different place in each kernel's)."""
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    schema = getattr(op, "_schema", None)
    names = [argument.name for argument in schema.arguments] if schema is not None else []
    if "is_causal" in names and names.index("is_causal") < len(args):
        return bool(args[names.index("is_causal")])
    return False
