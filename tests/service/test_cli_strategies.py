"""`autoshard strategies`: an op's strategies as JSON or a table; bad input exits 2 naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from service.cli import app
from strategies.ops.registry import lookup

KEYS = {"output", "inputs", "compute_s", "memory_bytes", "redistribute_s"}


def autoshard(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def strategies_json(*args: str) -> list[dict]:
    code, out, err = autoshard("strategies", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_mm_on_a_2x2_mesh_has_16_strategies_with_the_documented_keys() -> None:
    records = strategies_json("aten.mm.default", "--shapes", "64x32,32x16", "--mesh", "2x2")
    assert len(records) == 16
    assert all(set(r) == KEYS for r in records)
    first = records[0]
    assert first["output"] == [["R", "R"]] and first["inputs"] == [["R", "R"], ["R", "R"]]
    assert first["memory_bytes"] == 64 * 16 * 4
    assert all(len(r["redistribute_s"]) == 2 and len(r["inputs"]) == 2 for r in records)
    # From all-R every input placement is reached by slicing locally: nothing to pay.
    assert all(r["redistribute_s"] == [0.0, 0.0] for r in records)
    assert all(r["compute_s"] > 0 for r in records)
    fully_sharded = next(r for r in records if r["output"] == [["S(0)", "S(1)"]])
    assert fully_sharded["memory_bytes"] == 32 * 8 * 4
    assert fully_sharded["inputs"] == [["S(0)", "R"], ["R", "S(1)"]]


def test_the_op_may_be_named_without_its_default_overload() -> None:
    assert strategies_json("aten.mm", "--shapes", "64x32,32x16", "--mesh", "4") == strategies_json(
        "aten.mm.default", "--shapes", "64x32,32x16", "--mesh", "4"
    )


def test_sum_over_a_dim_given_as_json_arguments() -> None:
    records = strategies_json(
        "aten.sum.dim_IntList", "--args", '[{"shape": [8, 16]}, [1], false]', "--mesh", "4"
    )
    pairs = [(r["inputs"][0], r["output"][0]) for r in records]
    assert (["S(1)"], ["P"]) in pairs  # summing the sharded dim leaves partial sums
    assert (["S(0)"], ["S(0)"]) in pairs
    assert all(len(r["redistribute_s"]) == 1 for r in records)


def test_json_tensors_may_sit_in_lists_and_carry_their_own_dtype() -> None:
    records = strategies_json(
        "aten.cat.default",
        "--args",
        '[[{"shape": [8, 16], "dtype": "bf16"}, {"shape": [8, 4], "dtype": "bfloat16"}], 1]',
        "--mesh",
        "2",
    )
    assert all(len(r["inputs"]) == 2 for r in records)
    replicated = records[0]
    assert replicated["output"] == [["R"]] and replicated["memory_bytes"] == 8 * 20 * 2


def test_dtype_applies_to_every_shape() -> None:
    bf16 = strategies_json("aten.mm", "--shapes", "64x32,32x16", "--dtype", "bf16", "--mesh", "2")
    fp32 = strategies_json("aten.mm", "--shapes", "64x32,32x16", "--mesh", "2")
    assert [r["memory_bytes"] * 2 for r in bf16] == [r["memory_bytes"] for r in fp32]


def test_a_tuple_output_with_a_non_tensor_slot_is_null() -> None:
    op = torch.ops.aten.native_layer_norm_backward.default
    records = strategies_json(
        "aten.native_layer_norm_backward",
        "--args",
        '[{"shape": [8, 12]}, {"shape": [8, 12]}, [12], {"shape": [8, 1]}, {"shape": [8, 1]}, '
        '{"shape": [12]}, {"shape": [12]}, [true, false, true]]',
        "--mesh",
        "4",
    )
    assert op is not None and records
    assert all(r["output"][1] is None and len(r["output"]) == 3 for r in records)
    assert all(len(r["inputs"]) == 6 for r in records)


def test_the_table_names_op_shapes_mesh_hardware_count_and_source() -> None:
    code, out, _ = autoshard(
        "strategies", "aten.mm.default", "--shapes", "64x32,32x16", "--mesh", "2x2", "--axis-names", "x,y"
    )
    assert code == 0
    lines = out.strip().splitlines()
    title = lines[0]
    for text in (
        "aten.mm.default",
        "64x32:float32",
        "32x16:float32",
        "2x2",
        "(x, y)",
        "h100",
        "16 strategies",
    ):
        assert text in title
    assert "autoshard" in title
    assert lines[1].split()[:3] == ["#", "output", "inputs"]
    assert "compute µs" in lines[1] and "memory" in lines[1] and "redistribute µs" in lines[1]
    assert len(lines) == 2 + 16
    assert lines[2].split()[0] == "0" and "(R, R)" in lines[2] and "4.0 KiB" in lines[2]
    # aligned: every row starts its output column where the header does
    column = lines[1].index("output")
    assert all(line[column - 2 : column] == "  " and line[column] == "(" for line in lines[2:])


def test_the_table_says_when_pytorchs_rules_or_replication_were_used() -> None:
    assert lookup(torch.ops.aten.kthvalue.default) is None and lookup(torch.ops.aten.rot90.default) is None
    code, out, _ = autoshard(
        "strategies", "aten.kthvalue", "--args", '[{"shape": [8, 12]}, 3, 1]', "--mesh", "2"
    )
    assert code == 0 and "PyTorch" in out.splitlines()[0]
    code, out, _ = autoshard("strategies", "aten.rot90", "--shapes", "8x8", "--mesh", "2")
    assert code == 0 and "replicate fallback" in out.splitlines()[0] and "1 strategies" in out


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["aten.nosuchop.default", "--shapes", "4", "--mesh", "2"], "OP"),
        (["aten.mm.nosuchoverload", "--shapes", "4x4,4x4", "--mesh", "2"], "OP"),
        (["not an op", "--shapes", "4", "--mesh", "2"], "OP"),
        (["aten.mm", "--shapes", "64xa,32x16", "--mesh", "2"], "--shapes"),
        (["aten.mm", "--shapes", "64x32", "--mesh", "2"], "--shapes"),  # one argument short
        (["aten.mm", "--args", '[{"shape": [4, 4]}]', "--mesh", "2"], "--args"),
        (["aten.mm", "--args", "[{", "--mesh", "2"], "--args"),
        (["aten.mm", "--args", '[{"shape": [4, -4]}, {"shape": [4, 4]}]', "--mesh", "2"], "--args[0].shape"),
        (["aten.mm", "--args", '[{"shape": [4, 4], "dtype": "f77"}]', "--mesh", "2"], "--args[0].dtype"),
        (["aten.mm", "--args", '[{"size": [4, 4]}]', "--mesh", "2"], "--args[0]"),
        (["aten.mm", "--shapes", "4x4,4x4", "--dtype", "float77", "--mesh", "2"], "--dtype"),
        (["aten.mm", "--shapes", "4x4,4x4", "--mesh", "2y2"], "--mesh"),
        (["aten.mm", "--shapes", "4x4,4x4", "--mesh", "2x0"], "--mesh"),
        (["aten.mm", "--shapes", "4x4,4x4", "--mesh", "2x2", "--axis-names", "dp"], "--axis-names"),
        (["aten.mm", "--shapes", "4x4,4x4", "--mesh", "2", "--hardware", "tpu9"], "--hardware"),
        (["aten.mm", "--mesh", "2"], "--shapes / --args"),
        (["aten.mm", "--shapes", "4x4,4x4", "--args", "[]", "--mesh", "2"], "--shapes / --args"),
    ],
)
def test_bad_input_exits_2_naming_the_field(args: list[str], field: str) -> None:
    code, out, err = autoshard("strategies", *args)
    assert code == 2, (out, err)
    assert err.startswith(f"autoshard: {field}"), err
    assert "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1


def test_a_hardware_file_changes_the_figures_and_a_bad_one_names_its_field(tmp_path: Path) -> None:
    slow = tmp_path / "slow.yaml"
    slow.write_text("base: h100\nmemory_bandwidth: 1.0e9\nlaunch_s: 1.0e-9\n")
    args = ("aten.mm", "--shapes", "256x256,256x256", "--dtype", "bfloat16", "--mesh", "2")
    fast = strategies_json(*args)
    slowed = strategies_json(*args, "--hardware", str(slow))
    # 1 GB/s memory: every strategy moves at least 256 KiB, so over 190 µs instead of ~8 µs (a 5 µs launch
    # floor and the small GEMM's few tiles).
    assert all(s["compute_s"] > 1.9e-4 > 20 * f["compute_s"] for s, f in zip(slowed, fast, strict=True))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"inter_node": {"bandwidth": -1}}))
    code, _, err = autoshard("strategies", *args, "--hardware", str(bad))
    assert code == 2 and "inter_node.bandwidth" in err and err.startswith("autoshard: --hardware")


@torch.library.custom_op("autoshard_cli_test::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_a_broken_rule_is_one_line_and_exit_1() -> None:
    from strategies.ops.generate import clear_cache
    from strategies.ops.registry import _REGISTRY, register

    op = torch.ops.autoshard_cli_test.double.default
    register(op)(lambda info: [[0, 0, 0]])  # three entries for one output and one input
    try:
        code, out, err = autoshard(
            "strategies", "autoshard_cli_test.double", "--shapes", "8x8", "--mesh", "2"
        )
    finally:
        _REGISTRY.pop(op, None)
        clear_cache()
    assert code == 1 and out == ""
    assert err.startswith("autoshard: strategies for autoshard_cli_test.double failed: ValueError")
    assert len(err.strip().splitlines()) == 1
