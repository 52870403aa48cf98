"""Hardware presets: what one device computes and how fast its links move bytes.

Figures are per device (per GPU): dense peak FLOP/s per dtype, memory bandwidth and capacity, the
link inside a node (NVLink) and across nodes (InfiniBand, one NIC per GPU). Link bandwidth is the
unidirectional bytes/s a device can push, which is what ring collectives are bound by. Every figure
can be overridden from a JSON or YAML file with the same field names (see :func:`load_hardware`).
"""

from __future__ import annotations

import dataclasses
import json
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
        )

    __hash__ = HashOnce.__hash__  # dataclass(frozen=True) would otherwise generate one

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype name; unknown dtypes use ``default_flops_dtype``."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        if dtype.startswith("float8") and "float8" in self.peak_flops:
            return self.peak_flops["float8"]
        return self.peak_flops[self.default_flops_dtype]


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
) -> Hardware:
    return Hardware(
        name=name,
        peak_flops={"bfloat16": bf16, "float16": bf16, "float32": fp32, "float64": fp32 / 2, "float8": fp8},
        memory_bandwidth=hbm,
        memory_bytes=int(memory),
        node_size=8,
        intra_node=Link(bandwidth=nvlink, latency=2e-6),
        inter_node=Link(bandwidth=ib, latency=8e-6),
        launch_s=5e-6,
        host_to_device=pcie,
    )


PRESETS: dict[str, Hardware] = {
    # H100 SXM: 989 TFLOP/s bf16 dense, 67 fp32 (no TF32), 1979 fp8; 3.35 TB/s HBM3; NVLink 4 450 GB/s
    # per direction; 400 Gb/s InfiniBand NDR per GPU; PCIe 5.0 x16 to the host (~50 GB/s achieved).
    "h100": _gpu(
        "h100", 989 * TFLOPS, 67 * TFLOPS, 1979 * TFLOPS, 3.35e12, 80 * GIB, 450 * GB, 50 * GB, 50 * GB
    ),
    # H200 SXM: the H100's compute with 141 GB (141e9 bytes) of HBM3e at 4.8 TB/s; NVLink 4 and
    # InfiniBand and PCIe as h100.
    "h200": _gpu(
        "h200", 989 * TFLOPS, 67 * TFLOPS, 1979 * TFLOPS, 4.8e12, 141 * GB, 450 * GB, 50 * GB, 50 * GB
    ),
    # A100 SXM 80GB: 312 bf16, 19.5 fp32; 2.0 TB/s; NVLink 3 300 GB/s per direction; 200 Gb/s HDR;
    # PCIe 4.0 x16 (~25 GB/s achieved).
    "a100": _gpu(
        "a100", 312 * TFLOPS, 19.5 * TFLOPS, 312 * TFLOPS, 2.04e12, 80 * GIB, 300 * GB, 25 * GB, 25 * GB
    ),
    # B200: 2250 bf16 dense, 80 fp32, 4500 fp8; 8 TB/s HBM3e; NVLink 5 900 GB/s per direction;
    # 800 Gb/s per GPU; PCIe 6.0 x16 (~100 GB/s).
    "b200": _gpu(
        "b200", 2250 * TFLOPS, 80 * TFLOPS, 4500 * TFLOPS, 8.0e12, 180 * GIB, 900 * GB, 100 * GB, 100 * GB
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
    ),
}


class HardwareError(ValueError):
    """A hardware description that cannot be used; the message names the field."""


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


def override_hardware(data: dict[str, Any]) -> Hardware:
    """A preset (``data["base"]``, default ``h100``) with the other fields of ``data`` replacing its own."""
    data = dict(data)
    base_name = data.pop("base", "h100")
    if base_name not in PRESETS:
        raise HardwareError(f"hardware.base: unknown preset {base_name!r}; presets are {sorted(PRESETS)}")
    base = PRESETS[base_name]
    known = {f.name for f in dataclasses.fields(Hardware)}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise HardwareError(f"hardware.{key}: unknown field; fields are {sorted(known)}")
        current = getattr(base, key)
        if isinstance(current, Link):
            if not isinstance(value, dict) or set(value) - {"bandwidth", "latency"}:
                raise HardwareError(f"hardware.{key}: expected {{bandwidth, latency}}")
            link = {"bandwidth": current.bandwidth, "latency": current.latency}
            link.update({k: _positive(f"{key}.{k}", v) for k, v in value.items()})
            changes[key] = Link(**link)
        elif isinstance(current, dict):
            if not isinstance(value, dict):
                raise HardwareError(f"hardware.{key}: expected a mapping of dtype to FLOP/s")
            changes[key] = {**current, **{k: _positive(f"{key}.{k}", v) for k, v in value.items()}}
        elif key in ("name", "default_flops_dtype"):
            changes[key] = str(value)
        elif key in ("node_size", "memory_bytes"):
            changes[key] = int(_positive(key, value))
        else:
            changes[key] = _positive(key, value)
    return dataclasses.replace(base, **changes)


def _positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise HardwareError(f"hardware.{name}: expected a number, got {value!r}") from None
    if not v > 0 or v == float("inf"):
        raise HardwareError(f"hardware.{name}: must be positive and finite, got {value!r}")
    return v
