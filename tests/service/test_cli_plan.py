"""``autoshard plan``: writes the plan JSON, prints a summary, exits 0 / 2 (bad input) / 3 (no plan fits)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from service.cli import app


def autoshard(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_plan_writes_the_plan_and_prints_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, stdout, stderr = autoshard(
        "plan", "--model", "mlp", "--mesh", "4", "--batch", "65536", "--out", str(out), "--time-limit", "30"
    )
    assert code == 0, stderr
    plan = json.loads(out.read_text())
    assert plan["version"] == 1 and plan["parameters"]["w1.weight"] == ["R"]
    assert "predicted step time" in stdout and "certificate: optimal" in stdout
    assert "exposed," in stdout and "hidden behind compute" in stdout
    assert f"model FLOPs utilisation {100 * plan['predicted']['mfu']:.1f}%" in stdout
    assert "w1.weight" in stdout and f"plan written to {out}" in stdout
    assert "capturing" in stderr  # progress goes to stderr


def test_layers_with_the_same_placements_are_folded_in_the_summary() -> None:
    from service.plan_view import summary

    plan = {
        "mesh": {"shape": [2, 4], "axis_names": ["dp", "tp"], "hardware": "h100"},
        "parameters": {f"layers.{i}.attention.wq.weight": ["R", "S(0)"] for i in range(32)}
        | {"layers.7.feed_forward.w1.weight": ["S(0)", "S(0)"], "norm.weight": ["R", "R"]},
        "inputs": [["S(0)", "R"]],
        "predicted": {
            "step_time_s": 1.0,
            "compute_s": 0.9,
            "comm_s": 0.1,
            "comm_bytes": 2048,
            "peak_memory_bytes": 2**30,
        },
        "solver": {
            "backend": "highs",
            "status": "optimal",
            "bound": 1.0,
            "gap": 0.0,
            "variables": 10,
            "seconds": 1.0,
        },
        "request": {"model": "llama3-8b", "memory_gib": 80},
    }
    text = summary(plan)
    assert "layers.[0-31].attention.wq.weight  [R, S(0)]" in text
    assert "layers.[7].feed_forward.w1.weight" in text
    assert "of 80 GiB budget" in text


def test_unknown_models_and_bad_meshes_exit_2_naming_the_field(tmp_path: Path) -> None:
    code, _, stderr = autoshard("plan", "--model", "nope", "--mesh", "4", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "model" in stderr
    code, _, stderr = autoshard("plan", "--model", "mlp", "--mesh", "4x", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "mesh" in stderr
    code, _, stderr = autoshard(
        "plan", "--model", "mlp", "--mesh", "4", "--recompute", "sometimes", "--out", str(tmp_path / "p.json")
    )
    assert code == 2 and "recompute" in stderr and "auto, none, selective, full" in stderr


def test_the_plan_names_what_it_recomputes_and_the_summary_what_that_frees(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ("plan", "--model", "gpt2-small", "--layers", "2", "--mesh", "2", "--batch", "8", "--seq", "512")
    code, stdout, stderr = autoshard(*args, "--recompute", "full", "--out", str(out), "--time-limit", "30")
    assert code == 0, stderr
    plan = json.loads(out.read_text())
    assert plan["recompute"] and set(plan["recompute"]) <= {node["name"] for node in plan["nodes"]}
    predicted = plan["predicted"]
    assert 0 < predicted["recompute_s"] < predicted["compute_s"]
    assert predicted["recompute_freed_bytes"] > 0
    assert f"recomputation: {len(plan['recompute'])} values made again in the backward" in stdout
    code, stdout, _ = autoshard(*args, "--recompute", "none", "--out", str(out), "--time-limit", "30")
    none = json.loads(out.read_text())
    assert code == 0 and none["recompute"] == [] and none["predicted"]["recompute_s"] == 0
    assert none["predicted"]["peak_memory_bytes"] > predicted["peak_memory_bytes"]
    assert "recomputation: none" in stdout


def test_a_budget_nothing_fits_exits_3(tmp_path: Path) -> None:
    code, _, stderr = autoshard(
        "plan",
        "--model",
        "mlp",
        "--mesh",
        "4",
        "--batch",
        "16384",
        "--memory-gib",
        "0.01",
        "--out",
        str(tmp_path / "p.json"),
        "--time-limit",
        "20",
        "-q",
    )
    assert code == 3 and "no plan fits the budget of 0.01 GiB per device" in stderr
    assert "the smallest peak any plan can reach is" in stderr and " MiB per device" in stderr
    assert "usage_limit" not in stderr  # the solver's words stay inside


def test_the_summary_says_the_memory_left_and_what_the_fastest_plan_would_hold() -> None:
    from service.plan_view import summary

    plan = {
        "mesh": {"shape": [8], "axis_names": ["dp"], "hardware": "h100"},
        "parameters": {"w.weight": ["S(0)"]},
        "inputs": [["S(0)"]],
        "predicted": {
            "step_time_s": 1.005,
            "compute_s": 0.9,
            "comm_s": 0.105,
            "comm_bytes": 2048,
            "peak_memory_bytes": 30 * 2**30,
            "fastest": {"step_time_s": 1.0, "peak_memory_bytes": 50 * 2**30},
        },
        "solver": {
            "backend": "highs",
            "status": "feasible",
            "bound": 1.0,
            "gap": 0.005,
            "variables": 1,
            "seconds": 1.0,
        },
        "request": {"model": "mlp", "memory_gib": None},
    }
    text = summary(plan)
    # no budget given: the device's memory (the h100's 80 GiB) is the limit the memory left is counted from
    assert "peak memory per device 30.0 GiB of the device's memory (38%, 50.0 GiB left)" in text
    assert "the fastest plan peaks at 50.0 GiB (0.50% faster)" in text
    plan["mesh"]["hardware"] = "/some/where/hardware.yaml"  # not a preset: no file is opened for it
    assert "left" not in summary(plan)


def test_mixed_precision_is_asked_with_a_parameter_and_a_compute_dtype(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    mlp = ("plan", "--model", "mlp", "--mesh", "2", "--batch", "64", "--time-limit", "10")
    code, _, stderr = autoshard(
        *mlp, "--param-dtype", "float32", "--compute-dtype", "bfloat16", "--out", str(out)
    )
    assert code == 0, stderr
    request = json.loads(out.read_text())["request"]
    assert (request["dtype"], request["compute_dtype"]) == ("float32", "bfloat16")
    code, _, stderr = autoshard(*mlp, "--compute-dtype", "bfloat17", "--out", str(out))
    assert code == 2 and "compute_dtype: unknown 'bfloat17'" in stderr
    code, _, stderr = autoshard(*mlp, "--compute-dtype", "int8", "--out", str(out))
    assert code == 2 and "compute_dtype: must be a floating dtype, got int8" in stderr
