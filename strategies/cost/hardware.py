"""Hardware presets: what one device computes and how fast its links move bytes.

Figures are per device (per GPU): dense peak FLOP/s per dtype, memory bandwidth and capacity, the
link inside a node (NVLink) and across nodes (InfiniBand, one NIC per GPU). Link bandwidth is the
unidirectional bytes/s a device can push, which is what ring collectives are bound by. Every figure
can be overridden from a JSON or YAML file with the same field names (see :func:`load_hardware`), or
from a mapping a service receives (:func:`override_hardware`, within the bounds below).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strategies.cost.hashing import HashOnce

GB = 1e9
GIB = 2**30
TFLOPS = 1e12


@dataclass(frozen=True)
class Link:
    """One kind of interconnect: unidirectional bytes/s per device and per-hop latency in seconds."""

    bandwidth: float
    latency: float


@dataclass(frozen=True)
class Hardware(HashOnce):
    """One device type and the cluster it sits in."""

    name: str
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per dtype name (``bfloat16``, ``float32``, ``float8_e4m3fn``, …)."""
    memory_bandwidth: float
    """HBM bytes/s."""
    memory_bytes: int
    """Device memory capacity in bytes."""
    node_size: int
    """Devices per node; mesh axes whose span exceeds it run over ``inter_node``."""
    intra_node: Link
    inter_node: Link
    launch_s: float = 5e-6
    """Floor on any kernel's time (launch overhead), seconds."""
    collective_launch_s: float = 6.6e-6
    """Fixed cost of starting one collective, seconds (one all-reduce beats all-gather + reduce-scatter)."""
    host_to_device: float = 50 * GB
    """Bytes/s a device loads from its host (PCIe): what a data loader's batch costs each rank."""
    default_flops_dtype: str = field(default="float32")
    sm_count: int = 1
    """Streaming multiprocessors: how many GEMM tiles run at once (one wave)."""
    matmul_efficiency: float = 1.0
    """The share of the dense peak a large, well-shaped GEMM reaches (:mod:`strategies.cost.compute`)."""
    matmul_tile_m: int = 1
    """Rows of the output tile one multiprocessor computes; a GEMM pays for whole tiles."""
    matmul_tile_n: int = 1
    """Columns of that tile."""
    matmul_k_half: float = 0.0
    """The reduction length at which a GEMM runs at half its rate (a short ``K`` spends its time on loads)."""
    attention_efficiency: float = 1.0
    """The share of the dense peak a flash attention forward reaches on long sequences."""
    attention_backward_efficiency: float = 1.0
    """The same for its backward."""
    attention_seq_half: float = 0.0
    """The sequence length at which a flash attention kernel runs at half its long-sequence rate."""
    attention_head_dim: int = 1
    """The head dim flash kernels are tuned for; a smaller one runs proportionally slower."""
    memory_efficiency: float = 1.0
    """The share of ``memory_bandwidth`` a copy achieves: the rate of memory-bound ops."""
    sustained_efficiency: float = 1.0
    """The share of the kernels' benchmarked rates a whole training step sustains (clocks under a full step's
    power draw, the host's gaps between kernels, the kernels' own shapes and neighbours): fitted to published
    training runs (``benchmarks/truth.py --fit``), every op's time divided by it."""
    overlap_slowdown: float = 1.0
    """Seconds of compute lost per second of communication hidden behind it (collectives take multiprocessors
    and memory bandwidth from the kernels they overlap), fitted with ``sustained_efficiency``; 1, the default,
    hides nothing."""

    def hash_key(self) -> tuple:
        return (
            self.name,
            tuple(sorted(self.peak_flops.items())),
            self.memory_bandwidth,
            self.memory_bytes,
            self.node_size,
            self.intra_node,
            self.inter_node,
            self.launch_s,
            self.collective_launch_s,
            self.host_to_device,
            self.default_flops_dtype,
            *(getattr(self, name) for name in COMPUTE_FIGURES),
        )

    __hash__ = HashOnce.__hash__  # dataclass(frozen=True) would otherwise generate one

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype name; unknown dtypes use ``default_flops_dtype``."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype.startswith("float8") and "float8" in self.peak_flops:
            return self.peak_flops["float8"]
        return self.peak_flops[self.default_flops_dtype]


COMPUTE_FIGURES = (
    "sm_count",
    "matmul_efficiency",
    "matmul_tile_m",
    "matmul_tile_n",
    "matmul_k_half",
    "attention_efficiency",
    "attention_backward_efficiency",
    "attention_seq_half",
    "attention_head_dim",
    "memory_efficiency",
    "sustained_efficiency",
    "overlap_slowdown",
)
"""The fields of the achieved-compute model (:mod:`strategies.cost.compute`)."""


def _gpu(
    name: str,
    bf16: float,
    fp32: float,
    fp8: float,
    hbm: float,
    memory: float,
    nvlink: float,
    ib: float,
    pcie: float,
    **achieved: Any,
) -> Hardware:
    return Hardware(
        name=name,
        peak_flops={"bfloat16": bf16, "float16": bf16, "float32": fp32, "float64": fp32 / 2, "float8": fp8},
        memory_bandwidth=hbm,
        memory_bytes=int(memory),
        node_size=8,
        intra_node=Link(bandwidth=nvlink, latency=NVLINK_LATENCY_S),
        inter_node=Link(bandwidth=ib, latency=INTER_NODE_LATENCY_S),
        host_to_device=pcie,
        **achieved,
    )


# Achieved rates, fitted by `benchmarks/fit_hardware.py` to published measurements (its data file
# `benchmarks/data/published/kernels.yaml` holds every figure with its source):
# - GEMMs: H100 SXM bf16, 152 shapes: OpenXLA's measured sm_90 matmul table (tensorflow/tensorflow@372d578
#   third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h), the MAMF table of stas00/ml-engineering
#   (794.5 of 989 TFLOP/s at best), cuBLAS 716 / 795 TFLOP/s at 4096^3 / 8192^3 (pranjalssh/fast.cu README):
#   median |error| 5.3%. A100 bf16: NVIDIA's "Mixed-precision matrix multiply on A100 with cuBLAS" figure and
#   the MAMF table (271.2 of 312), sharing the H100's reduction ramp and kernel floor: median 2.8%.
# - Flash attention: FlashAttention-2 (what PyTorch's SDPA runs), the FA2 README benchmarks
#   (Dao-AILab/flash-attention assets/flash2_{a100,h100}_fwd_bwd_benchmark.png) and the FA2 bars of the
#   FlashAttention-3 paper's H100 figures (arXiv 2407.08608): H100 72 points, median 2.8%; A100 24, median
#   2.4%.
#   A FlashAttention-3 or cuDNN kernel runs faster (FA3 forward, head dim 128: 648 TFLOP/s): a hardware file
#   with `attention_efficiency: 0.65` models it.
# - Memory-bound ops: copies reach 0.88 of A100 80GB's 2.04 TB/s (NVIDIA developer forum, "Trouble to reach
#   peak bandwidth of A100", 1.80 TB/s) and 0.78 of an H100 NVL's (BabelStream 5.0 copy, 3056 of 3900 GB/s; no
#   SXM figure was found).
# - Links: NVLink's bus bandwidth is nccl-tests' large-message all-gather / reduce-scatter busbw (8x H200,
#   same NVLink 4 fabric as H100: 361.4 / 362.9 GB/s, stas00/ml-engineering network/README.md; A100: 232 GB/s,
#   NVIDIA GTC24 S62129 slide 12); across nodes, per GPU, the same slide's 8x400 Gb/s NDR DGX H100
#   all-reduce 380 GB/s over 8 NICs (47.5 GB/s each) and DGX A100 8x200 Gb/s 192 GB/s (24 each). NVLink's
#   per-hop latency and the collective launch are fitted to the 8-GPU all-reduce curve up to 1 MiB, where
#   NCCL runs rings (median 2.4%).
# - Overlap: compute running beside a collective is slowed by 18.9% on average (max 40%) (Lee et al.,
#   "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning", arXiv
#   2507.03114, abstract: GPT and LLaMA training on 4 A100, H100, MI250, MI210): `overlap_slowdown` 0.19
#   seconds of compute per second hidden. Measured, not fitted: fitted to the runs below it lands at its
#   bound, 1.0 (benchmarks/README.md says why that was not kept).
# - A whole step: `sustained_efficiency` (per GPU) is fitted by `benchmarks/truth.py --fit` to 15 published
#   training runs (MosaicML llm-foundry's MPT tables, IBM fms-fsdp's Llama 2 table) and llm-foundry's
#   8 -> 128 / 512 GPU throughput changes. torchtitan's runs are held out, as is the LLaMA paper's
#   2048-GPU run (benchmarks/README.md has the table).
HOPPER = dict(
    sm_count=132,
    matmul_efficiency=0.829,
    matmul_tile_m=128,
    matmul_tile_n=128,
    matmul_k_half=89.5,
    attention_efficiency=0.404,
    attention_backward_efficiency=0.328,
    attention_seq_half=179.0,
    attention_head_dim=128,
    memory_efficiency=0.78,
    launch_s=5.0e-6,
    collective_launch_s=6.8e-6,
    sustained_efficiency=0.737,
    overlap_slowdown=0.19,
)
AMPERE = dict(
    HOPPER,
    sm_count=108,
    matmul_efficiency=0.881,
    attention_efficiency=0.713,
    attention_backward_efficiency=0.666,
    attention_seq_half=216.0,
    memory_efficiency=0.88,
    sustained_efficiency=0.830,
)
BLACKWELL = dict(HOPPER, sm_count=148)
"""No published B200 kernel figures were fitted: Hopper's shares of its peaks."""
NVLINK_LATENCY_S = 2.28e-6
INTER_NODE_LATENCY_S = 8e-6
"""Per inter-node hop; not fitted (see `benchmarks/fit_hardware.py`'s NOT_ADOPTED)."""

PRESETS: dict[str, Hardware] = {
    # H100 SXM: 989 TFLOP/s bf16 dense, 67 fp32 (no TF32), 1979 fp8; 3.35 TB/s HBM3; NVLink 4 (450 GB/s per
    # direction, 362 achieved); 400 Gb/s InfiniBand NDR per GPU (47.5 GB/s achieved); PCIe 5.0 x16 to the host
    # (~50 GB/s achieved). Links and rates as achieved: see above.
    "h100": _gpu(
        "h100",
        989 * TFLOPS,
        67 * TFLOPS,
        1979 * TFLOPS,
        3.35e12,
        80 * GIB,
        362 * GB,
        47.5 * GB,
        50 * GB,
        **HOPPER,
    ),
    # H200 SXM: the H100's compute with 141 GB (141e9 bytes) of HBM3e at 4.8 TB/s; NVLink 4 and
    # InfiniBand and PCIe as h100.
    "h200": _gpu(
        "h200",
        989 * TFLOPS,
        67 * TFLOPS,
        1979 * TFLOPS,
        4.8e12,
        141 * GB,
        362 * GB,
        47.5 * GB,
        50 * GB,
        **HOPPER,
    ),
    # A100 SXM 80GB: 312 bf16, 19.5 fp32; 2.0 TB/s; NVLink 3 (300 GB/s per direction, 232 achieved); 200 Gb/s
    # HDR (24 GB/s achieved); PCIe 4.0 x16 (~25 GB/s achieved).
    "a100": _gpu(
        "a100",
        312 * TFLOPS,
        19.5 * TFLOPS,
        312 * TFLOPS,
        2.04e12,
        80 * GIB,
        232 * GB,
        24 * GB,
        25 * GB,
        **AMPERE,
    ),
    # B200: 2250 bf16 dense, 80 fp32, 4500 fp8; 8 TB/s HBM3e; NVLink 5 900 GB/s per direction; 800 Gb/s per
    # GPU; PCIe 6.0 x16 (~100 GB/s). Nominal links: no published B200 figures were fitted.
    "b200": _gpu(
        "b200",
        2250 * TFLOPS,
        80 * TFLOPS,
        4500 * TFLOPS,
        8.0e12,
        180 * GIB,
        900 * GB,
        100 * GB,
        100 * GB,
        **BLACKWELL,
    ),
    # A CPU host running gloo over loopback, like this development machine.
    "cpu": Hardware(
        name="cpu",
        peak_flops={"float32": 100e9, "bfloat16": 50e9, "float16": 50e9, "float64": 50e9},
        memory_bandwidth=20 * GB,
        memory_bytes=24 * 2**30,
        node_size=1024,
        intra_node=Link(bandwidth=2 * GB, latency=30e-6),
        inter_node=Link(bandwidth=1 * GB, latency=60e-6),
        launch_s=2e-6,
        collective_launch_s=50e-6,
        host_to_device=10 * GB,
        # overlap_slowdown stays 1: gloo runs collectives on the cores that compute, nothing is hidden
    ),
}


PLAIN_ROOFLINE: dict[str, float] = {
    f.name: f.default for f in dataclasses.fields(Hardware) if f.name in COMPUTE_FIGURES
}
"""Hardware-file figures that price as the plain roofline with nothing hidden (the fields' defaults): every op
at ``max(FLOPs / peak, bytes / memory_bandwidth) + launch_s`` and every collective on the step's critical path
(the model before achieved rates and the two-stream schedule)."""


class HardwareError(ValueError):
    """A hardware description that cannot be used; the message names the field."""


MAX_MEMORY_BYTES = 2**53
"""Largest device memory: byte counts up to it are exact in float64, which the cost model computes in."""
MAX_NODE_SIZE = 2**20
"""Most devices per node, as many as a mesh may have in all."""
MAX_BANDWIDTH = 1e16
"""Largest bytes/s of any link or memory (10 PB/s, 1000x today's HBM)."""
MAX_FLOPS = 1e19
"""Largest FLOP/s of any dtype (10 EFLOP/s per device, 1000x today's fp8)."""
MAX_SECONDS = 1.0
"""Longest latency or launch time."""
MAX_EFFICIENCY = 1.0
"""Largest share of a peak any kernel reaches."""
MAX_LENGTH = 2**31
"""Largest tile edge, head dim or half-rate length (elements)."""
MAX_DTYPES = 32
"""Most dtypes ``peak_flops`` may hold."""
MAX_DTYPE_CHARS = 32
"""Longest dtype name (a ``peak_flops`` key, ``default_flops_dtype``)."""
MAX_NAME_CHARS = 64
"""Longest hardware name."""

_MAXIMA = {
    "memory_bandwidth": MAX_BANDWIDTH,
    "host_to_device": MAX_BANDWIDTH,
    "launch_s": MAX_SECONDS,
    "collective_launch_s": MAX_SECONDS,
    "matmul_efficiency": MAX_EFFICIENCY,
    "attention_efficiency": MAX_EFFICIENCY,
    "attention_backward_efficiency": MAX_EFFICIENCY,
    "memory_efficiency": MAX_EFFICIENCY,
    "sustained_efficiency": MAX_EFFICIENCY,
    "overlap_slowdown": MAX_EFFICIENCY,
    "matmul_k_half": MAX_LENGTH,
    "attention_seq_half": MAX_LENGTH,
}
"""Field -> its largest value, for the figures that are not whole numbers, links or ``peak_flops``."""
_MAY_BE_ZERO = {"overlap_slowdown", "matmul_k_half", "attention_seq_half"}
"""Figures that may be 0 (no slowdown) besides positive."""
_WHOLE_MAXIMA = {
    "memory_bytes": MAX_MEMORY_BYTES,
    "node_size": MAX_NODE_SIZE,
    "sm_count": MAX_NODE_SIZE,
    "matmul_tile_m": MAX_LENGTH,
    "matmul_tile_n": MAX_LENGTH,
    "attention_head_dim": MAX_LENGTH,
}
"""Whole-number field -> its largest value."""
_LINK_MAXIMA = {"bandwidth": MAX_BANDWIDTH, "latency": MAX_SECONDS}
"""Link field -> its largest value."""


def preset_hardware(name: str) -> Hardware:
    """A preset by name only (``h100``, ``h200``, ``a100``, ``b200``, ``cpu``), never a file: for a caller
    (a service) that must not read a path a request names. An unknown name is not echoed back."""
    if isinstance(name, str) and name in PRESETS:
        return PRESETS[name]
    raise HardwareError(f"hardware: unknown preset; presets are {sorted(PRESETS)}")


def get_hardware(name_or_path: str | Hardware) -> Hardware:
    """A preset by name (``h100``, ``h200``, ``a100``, ``b200``, ``cpu``) or a JSON/YAML file (see
    load_hardware)."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix.lower() in (".json", ".yaml", ".yml"):
        return load_hardware(path)
    raise HardwareError(
        f"hardware: unknown preset {name_or_path!r}; presets are {sorted(PRESETS)} or a .json/.yaml file"
    )


def load_hardware(path: str | Path) -> Hardware:
    """Read a hardware file: ``base`` names a preset (default ``h100``), other fields override it.

    Example (YAML)::

        base: h100
        node_size: 4
        inter_node: {bandwidth: 25e9}
        peak_flops: {bfloat16: 800e12}
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise HardwareError(f"hardware: cannot read {path}: {e.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HardwareError(f"hardware: {path} is not valid JSON: {e}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise HardwareError(f"hardware: {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise HardwareError(f"hardware: {path} must hold a mapping of fields")
    return override_hardware(data)


def override_hardware(data: Mapping[str, Any]) -> Hardware:
    """A preset (``data["base"]``, default ``h100``) with the other fields of ``data`` replacing its own.

    Every figure must be a finite number above 0 (not a bool; a numeric string, as YAML writes ``1e9``, is
    read as its number) and at most its bound: ``memory_bytes`` a whole number up to
    :data:`MAX_MEMORY_BYTES`, ``node_size`` a whole number up to :data:`MAX_NODE_SIZE`, bandwidths up to
    :data:`MAX_BANDWIDTH` bytes/s, FLOP/s up to :data:`MAX_FLOPS`, latencies and launch times up to
    :data:`MAX_SECONDS`. ``peak_flops`` holds at most :data:`MAX_DTYPES` dtypes named by strings of at most
    :data:`MAX_DTYPE_CHARS` characters; ``name`` is a string of at most :data:`MAX_NAME_CHARS` characters;
    ``default_flops_dtype`` must be a dtype of the resulting ``peak_flops``. Anything else raises
    :class:`HardwareError` whose message starts with ``hardware.<field>: ``.
    """
    if not isinstance(data, Mapping):
        raise HardwareError("hardware: expected a mapping of fields")
    data = dict(data)
    base_name = data.pop("base", "h100")
    if not isinstance(base_name, str) or base_name not in PRESETS:
        raise HardwareError(f"hardware.base: unknown preset; presets are {sorted(PRESETS)}")
    base = PRESETS[base_name]
    known = {f.name for f in dataclasses.fields(Hardware)}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            if not isinstance(key, str) or len(key) > MAX_NAME_CHARS:
                raise HardwareError(f"hardware: unknown field, a long name; fields are {sorted(known)}")
            raise HardwareError(f"hardware.{key}: unknown field; fields are {sorted(known)}")
        changes[key] = _field(key, value, getattr(base, key))
    hardware = dataclasses.replace(base, **changes)
    if hardware.default_flops_dtype not in hardware.peak_flops:
        raise HardwareError(
            f"hardware.default_flops_dtype: {hardware.default_flops_dtype!r} is not a dtype of peak_flops "
            f"{sorted(hardware.peak_flops)}"
        )
    return hardware


def _field(key: str, value: Any, current: Any) -> Any:
    """The checked value of field ``key`` (whose preset value is ``current``)."""
    if isinstance(current, Link):
        if not isinstance(value, Mapping) or set(value) - set(_LINK_MAXIMA):
            raise HardwareError(f"hardware.{key}: expected {{bandwidth, latency}}")
        link = {"bandwidth": current.bandwidth, "latency": current.latency}
        link.update({k: _positive(f"{key}.{k}", v, _LINK_MAXIMA[k]) for k, v in value.items()})
        return Link(**link)
    if key == "peak_flops":
        return _peak_flops(value, current)
    if key == "name":
        return _text(key, value, MAX_NAME_CHARS)
    if key == "default_flops_dtype":
        return _text(key, value, MAX_DTYPE_CHARS)
    if key in _WHOLE_MAXIMA:
        return _whole(key, value, _WHOLE_MAXIMA[key])
    if key in _MAY_BE_ZERO and not isinstance(value, bool) and value == 0:
        return 0.0
    return _positive(key, value, _MAXIMA[key])


def _peak_flops(value: Any, current: dict[str, float]) -> dict[str, float]:
    """``current`` with the dtypes of ``value`` added or replaced, each FLOP/s checked."""
    if not isinstance(value, Mapping):
        raise HardwareError("hardware.peak_flops: expected a mapping of dtype to FLOP/s")
    if len(value) > MAX_DTYPES:
        raise HardwareError(f"hardware.peak_flops: at most {MAX_DTYPES} dtypes")
    if not all(isinstance(k, str) and 1 <= len(k) <= MAX_DTYPE_CHARS for k in value):
        raise HardwareError(
            f"hardware.peak_flops: dtype names are strings of 1 to {MAX_DTYPE_CHARS} characters"
        )
    merged = {**current, **{k: _positive(f"peak_flops.{k}", v, MAX_FLOPS) for k, v in value.items()}}
    if len(merged) > MAX_DTYPES:
        raise HardwareError(f"hardware.peak_flops: at most {MAX_DTYPES} dtypes with the base preset's")
    return merged


def _text(name: str, value: Any, max_chars: int) -> str:
    """``value``, a string of 1 to ``max_chars`` characters."""
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars:
        raise HardwareError(f"hardware.{name}: expected a string of 1 to {max_chars} characters")
    return value


def _whole(name: str, value: Any, maximum: int) -> int:
    """``value``, a positive whole number (``4`` or ``4.0``) at most ``maximum``, as an int."""
    number = _positive(name, value, maximum)
    if isinstance(value, int):  # compared exactly: 2**53 + 1 rounds to 2**53 as a float
        if value > maximum:
            raise HardwareError(f"hardware.{name}: must be at most {maximum}, got {_shown(value)}")
        return value
    if not number.is_integer():
        raise HardwareError(f"hardware.{name}: must be a whole number, got {_shown(value)}")
    return int(number)


def _positive(name: str, value: Any, maximum: float) -> float:
    """``value`` as a float: a number (or numeric string) that is finite, above 0 and at most ``maximum``;
    a bool is not a number here."""
    if isinstance(value, bool):
        raise HardwareError(f"hardware.{name}: expected a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float: finite, but over every bound
        number = 2 * maximum if value > 0 else -math.inf
    except (TypeError, ValueError):
        raise HardwareError(f"hardware.{name}: expected a number, got {_shown(value)}") from None
    if not (number > 0 and math.isfinite(number)):
        raise HardwareError(f"hardware.{name}: must be positive and finite, got {_shown(value)}")
    if number > maximum:
        limit = str(maximum) if isinstance(maximum, int) else f"{maximum:g}"
        raise HardwareError(f"hardware.{name}: must be at most {limit}, got {_shown(value)}")
    return number


def _shown(value: Any) -> str:
    """``value`` for a message: a number or a short string as written, a huge integer by its size, anything
    else by its type, so a caller's long text is never echoed back."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, int | float) or (isinstance(value, str) and len(value) <= 32):
        return repr(value)
    return f"a {type(value).__name__}"
