"""The GPU presets (the H200 is an H100 with more and faster memory), presets by name only, and the
bounds on overriding a preset's figures."""

from __future__ import annotations

import math

import pytest
import torch

from strategies.cost.hardware import (
    MAX_MEMORY_BYTES,
    PRESETS,
    HardwareError,
    get_hardware,
    override_hardware,
    preset_hardware,
)
from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.tensor_meta import TensorMeta

aten = torch.ops.aten


def _replicated_compute_s(hardware: str, op: object, *shapes: tuple[int, ...]) -> float:
    args = tuple(TensorMeta(s, torch.bfloat16) for s in shapes)
    return float(op_strategies(op, args, {}, make_mesh((1,), hardware=hardware)).compute_s[0])


def test_h200_has_the_h100s_compute_and_141_gb_at_4_8_tb_per_s() -> None:
    h100, h200 = PRESETS["h100"], get_hardware("h200")
    assert h200.name == "h200" and h200.peak_flops == h100.peak_flops
    assert h200.memory_bytes == 141 * 10**9 and h200.memory_bandwidth == 4.8e12
    assert (h200.intra_node, h200.inter_node, h200.node_size) == (h100.intra_node, h100.inter_node, 8)
    assert h100.memory_bytes == 80 * 2**30  # the other presets keep their GiB capacities


def test_h200_runs_a_big_mm_as_fast_as_h100_and_a_big_add_faster() -> None:
    n = 8192
    assert math.isclose(
        _replicated_compute_s("h200", aten.mm.default, (n, n), (n, n)),
        _replicated_compute_s("h100", aten.mm.default, (n, n), (n, n)),
    )
    add_h100 = _replicated_compute_s("h100", aten.add.Tensor, (n, n), (n, n)) - PRESETS["h100"].launch_s
    add_h200 = _replicated_compute_s("h200", aten.add.Tensor, (n, n), (n, n)) - PRESETS["h200"].launch_s
    assert math.isclose(add_h100 / add_h200, 4.8 / 3.35, rel_tol=1e-6)


def test_unknown_preset_lists_h200() -> None:
    with pytest.raises(HardwareError, match="'h200'"):
        get_hardware("h300")


# ----------------------------------------------------------------------------------- presets by name only


def test_preset_hardware_gives_a_preset_by_name() -> None:
    assert preset_hardware("h200") is PRESETS["h200"]


@pytest.mark.parametrize("name", ["tpu", "/etc/hosts.yaml", "hw.json", "x" * 1000])
def test_preset_hardware_never_reads_a_file_nor_echoes_the_name(name: str) -> None:
    with pytest.raises(HardwareError) as error:
        preset_hardware(name)
    assert str(error.value) == "hardware: unknown preset; presets are ['a100', 'b200', 'cpu', 'h100', 'h200']"


# ---------------------------------------------------------------------------------- bounded overrides


def _refusal(data: dict) -> str:
    """The message of the HardwareError ``override_hardware(data)`` raises."""
    with pytest.raises(HardwareError) as error:
        override_hardware(data)
    return str(error.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"memory_bandwidth": True}, "hardware.memory_bandwidth: expected a number, got True"),
        ({"launch_s": 0}, "hardware.launch_s: must be positive and finite, got 0"),
        ({"host_to_device": float("nan")}, "hardware.host_to_device: must be positive and finite, got nan"),
        (
            {"intra_node": {"latency": -1e-6}},
            "hardware.intra_node.latency: must be positive and finite, got -1e-06",
        ),
        (
            {"peak_flops": {"bfloat16": "inf"}},
            "hardware.peak_flops.bfloat16: must be positive and finite, got 'inf'",
        ),
        ({"node_size": False}, "hardware.node_size: expected a number, got False"),
        ({"memory_bandwidth": "x" * 100}, "hardware.memory_bandwidth: expected a number, got a str"),
    ],
)
def test_every_figure_is_a_finite_number_above_zero_and_not_a_bool(data: dict, message: str) -> None:
    assert _refusal(data) == message


def test_memory_bytes_is_a_whole_number_at_most_2_to_the_53() -> None:
    assert override_hardware({"memory_bytes": MAX_MEMORY_BYTES}).memory_bytes == 2**53
    assert override_hardware({"memory_bytes": 96e9}).memory_bytes == 96 * 10**9
    assert _refusal({"memory_bytes": 2**53 + 1}) == (
        "hardware.memory_bytes: must be at most 9007199254740992, got 9007199254740993"
    )
    assert _refusal({"memory_bytes": 10**400}) == (
        "hardware.memory_bytes: must be at most 9007199254740992, got an integer of 1329 bits"
    )
    assert _refusal({"memory_bytes": 1.5}) == "hardware.memory_bytes: must be a whole number, got 1.5"


def test_node_size_is_a_whole_number_from_1_to_2_to_the_20() -> None:
    node_size = override_hardware({"node_size": 4.0}).node_size
    assert node_size == 4 and isinstance(node_size, int)
    assert _refusal({"node_size": 2.5}) == "hardware.node_size: must be a whole number, got 2.5"
    assert _refusal({"node_size": 2**20 + 1}) == "hardware.node_size: must be at most 1048576, got 1048577"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"memory_bandwidth": 2e16}, "memory_bandwidth"),
        ({"host_to_device": 2e16}, "host_to_device"),
        ({"intra_node": {"bandwidth": 2e16}}, "intra_node.bandwidth"),
        ({"inter_node": {"bandwidth": 2e16}}, "inter_node.bandwidth"),
    ],
)
def test_bandwidths_are_at_most_1e16_bytes_per_second(data: dict, field: str) -> None:
    assert _refusal(data) == f"hardware.{field}: must be at most 1e+16, got 2e+16"


def test_peak_flops_are_at_most_1e19() -> None:
    assert override_hardware({"peak_flops": {"float8": 1e19}}).peak_flops["float8"] == 1e19
    assert (
        _refusal({"peak_flops": {"float8": 2e19}})
        == "hardware.peak_flops.float8: must be at most 1e+19, got 2e+19"
    )


@pytest.mark.parametrize(
    "field", ["launch_s", "collective_launch_s", "intra_node.latency", "inter_node.latency"]
)
def test_latencies_and_launch_times_are_at_most_one_second(field: str) -> None:
    key, _, link_key = field.partition(".")
    data = {key: {link_key: 1.5}} if link_key else {key: 1.5}
    assert _refusal(data) == f"hardware.{field}: must be at most 1, got 1.5"


def test_peak_flops_holds_at_most_32_dtypes_named_by_short_strings() -> None:
    added = {f"float{i}x": 1e12 for i in range(27)}  # the base preset has 5
    assert len(override_hardware({"peak_flops": added}).peak_flops) == 32
    assert _refusal({"peak_flops": {**added, "one_more": 1e12}}) == (
        "hardware.peak_flops: at most 32 dtypes with the base preset's"
    )
    assert (
        _refusal({"peak_flops": {f"d{i}": 1e12 for i in range(33)}})
        == "hardware.peak_flops: at most 32 dtypes"
    )
    for key in ("x" * 33, "", 8):
        assert _refusal({"peak_flops": {key: 1e12}}) == (
            "hardware.peak_flops: dtype names are strings of 1 to 32 characters"
        )


def test_name_is_a_string_of_at_most_64_characters() -> None:
    assert override_hardware({"name": "n" * 64}).name == "n" * 64
    for name in ("n" * 65, 100, ""):
        assert _refusal({"name": name}) == "hardware.name: expected a string of 1 to 64 characters"


def test_default_flops_dtype_must_be_a_dtype_of_the_resulting_peak_flops() -> None:
    hardware = override_hardware({"peak_flops": {"tf32": 495e12}, "default_flops_dtype": "tf32"})
    assert hardware.flops_for("int8") == 495e12
    assert _refusal({"default_flops_dtype": "int4"}) == (
        "hardware.default_flops_dtype: 'int4' is not a dtype of peak_flops "
        "['bfloat16', 'float16', 'float32', 'float64', 'float8']"
    )
    assert _refusal({"default_flops_dtype": "d" * 33}) == (
        "hardware.default_flops_dtype: expected a string of 1 to 32 characters"
    )


def test_an_unknown_base_or_long_field_name_is_not_echoed() -> None:
    presets = "['a100', 'b200', 'cpu', 'h100', 'h200']"
    assert _refusal({"base": "/etc/passwd"}) == f"hardware.base: unknown preset; presets are {presets}"
    assert _refusal({"base": ["h100"]}) == f"hardware.base: unknown preset; presets are {presets}"
    assert _refusal({"f" * 65: 1}).startswith("hardware: unknown field, a long name; fields are [")


def test_numeric_strings_as_yaml_writes_them_are_read_as_numbers() -> None:
    hardware = override_hardware({"launch_s": "1e-5", "memory_bytes": "96e9"})
    assert (hardware.launch_s, hardware.memory_bytes) == (1e-5, 96 * 10**9)
