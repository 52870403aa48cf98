"""benchmarks/compute_calibration.py: exported calls rebuild and run on local shapes, and ``measure`` needs
nothing of autoshard."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.calibration_export import Skip, call_record, encode, records_of
from benchmarks.compute_calibration import FORMAT, build_call, decode, measure, op_family
from strategies.cost.mesh import make_mesh
from strategies.ops.generate import OpStrategies, op_strategies
from strategies.plan.planner import PlanRequest, _capture, _layer_repeat
from strategies.problem.builder import BuiltProblem, ProblemNode
from strategies.tensor_meta import TensorMeta

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]
TINY_LLAMA = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 96, "ffn_dim": 128}


@pytest.fixture(scope="module")
def tiny() -> tuple[BuiltProblem, np.ndarray]:
    """A tiny Llama on 2x2 with every op on its cheapest (most sharded) strategy: many local shapes."""
    request = PlanRequest(model="llama3-8b", mesh="2x2", batch=4, seq=16, layers=4, options=TINY_LLAMA)
    built = _capture(request, make_mesh("2x2"), _layer_repeat(request), lambda _m: None, {})("none")
    chosen = np.array([int(np.argmin(n.compute_s)) if n.kind == "op" else 0 for n in built.nodes])
    return built, chosen


def test_records_cover_the_plans_compute_and_hold_local_shapes(tiny: tuple) -> None:
    built, chosen = tiny
    doc = records_of(built, chosen)
    weights = built.node_weights()
    total = sum(
        w * n.compute_s[c] for n, w, c in zip(built.nodes, weights, chosen, strict=True) if n.kind == "op"
    )  # the ops' compute: inputs' loads are not kernels
    assert math.isclose(doc["records_compute_s"] + doc["skipped_compute_s"], total, rel_tol=1e-9)
    assert doc["format"] == FORMAT and not doc["skipped"]
    ops = sum(1 for n, c in zip(built.nodes, chosen, strict=True) if n.kind == "op" and n.compute_s[c] > 0)
    assert sum(r["count"] for r in doc["records"]) == ops
    families = {r["family"] for r in doc["records"]}
    assert families == {"matmul", "attention", "pointwise/norm", "other"}
    # the token embedding [96, 64] is cut on the mesh: its call reads a piece of it
    embedding = next(r for r in doc["records"] if r["op"] == "aten.embedding.default")
    rows, cols = embedding["inputs"][0]["shape"]
    assert rows * cols < 96 * 64 and embedding["inputs"][1]["high"] == rows


def test_every_record_rebuilds_and_runs_with_the_local_output_shapes(tiny: tuple) -> None:
    built, chosen = tiny
    doc = records_of(built, chosen)
    results = measure(doc, device="cpu", repeats=1, warmup=0)
    calls = [r for r in results["records"] if r["family"] != "reference"]
    assert len(calls) == len(doc["records"])
    failed = [
        (r["op"], r.get("error"), r.get("output_error")) for r in results["records"] if "measured_s" not in r
    ]
    assert not failed
    assert not [r for r in results["records"] if "output_error" in r]
    assert results["totals"]["ran"] == len(doc["records"])
    assert math.isclose(results["totals"]["predicted_s"], doc["records_compute_s"], rel_tol=1e-9)
    # a dry run on meta runs the CUDA kernels' shape functions: flash attention for the CPU op
    dry = measure(doc, device="meta", repeats=1, warmup=0)
    assert all("measured_s" in r and "output_error" not in r for r in dry["records"])
    assert {r["ran_as"] for r in dry["records"] if r["family"] == "attention"} == {
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_flash_attention_backward.default",
    }
    # and the outputs really are the exported local shapes (measure checks them; check one by hand)
    record = next(
        r for r in doc["records"] if r["op"] == "aten._scaled_dot_product_flash_attention_for_cpu.default"
    )
    fn, _ = build_call(record, "cpu", torch.Generator().manual_seed(0))
    out, logsumexp = fn()
    assert [list(out.shape), list(logsumexp.shape)] == [o["shape"] for o in record["outputs"]]


def test_a_view_that_names_global_sizes_is_skipped_with_the_reason() -> None:
    strategies = op_strategies(aten.view.default, (TensorMeta((8, 4)), [32]), {}, make_mesh((2,)))
    sharded = int(np.flatnonzero(strategies.input_specs[:, 0, 0] == 0)[0])
    node = _node(strategies, aten.view.default, (TensorMeta((8, 4)), [32]))
    with pytest.raises(Skip, match="local shapes"):
        call_record(node, sharded, (2,))
    assert call_record(node, 0, (2,))["outputs"] == [{"shape": [32], "dtype": "float32"}]


def test_a_row_sharded_embedding_gradient_counts_its_local_rows() -> None:
    args = (TensorMeta((4, 16, 8), torch.bfloat16), TensorMeta((4, 16), torch.int64), 96, -1, False)
    node = ProblemNode(
        name="embedding_dense_backward",
        kind="op",
        op=aten.embedding_dense_backward.default,
        output_specs=np.array([[[0]]], dtype=np.int16),  # rows cut over a mesh of 2
        input_specs=np.array([[[-1], [-1]]], dtype=np.int16),
        outputs=(TensorMeta((96, 8), torch.bfloat16),),
        compute_s=np.array([1e-5]),
        memory_bytes=np.array([0]),
        call=(args, {}),
    )
    record = call_record(node, 0, (2,))
    assert record["args"][2] == 48 and record["inputs"][1]["high"] == 48
    assert record["outputs"] == [{"shape": [48, 8], "dtype": "bfloat16"}]


def test_arguments_round_trip_through_json() -> None:
    value = [
        TensorMeta((2,)),
        [1, -1],
        float("inf"),
        torch.bfloat16,
        torch.channels_last,
        torch.strided,
        None,
    ]
    encoded = json.loads(json.dumps(encode(value, iter(range(1)))))
    tensor = torch.ones(2)
    decoded = decode(encoded, [tensor], "cpu")
    assert decoded[0] is tensor
    assert decoded[1:] == [[1, -1], math.inf, torch.bfloat16, torch.channels_last, torch.strided, None]
    assert decode(encode(torch.device("meta"), iter(())), [], "cpu") == torch.device("cpu")
    assert op_family("autoshard.einsum.default") == "matmul"
    assert op_family("aten.silu_backward.default") == "pointwise/norm"


def test_measure_runs_from_a_lone_copy_without_autoshard(tmp_path: Path, tiny: tuple) -> None:
    built, chosen = tiny
    doc = records_of(built, chosen)
    doc["records"] = [r for r in doc["records"] if r["family"] in ("attention", "other")]
    (tmp_path / "ops.json").write_text(json.dumps(doc))
    shutil.copy(ROOT / "benchmarks" / "compute_calibration.py", tmp_path / "compute_calibration.py")
    command = [sys.executable, "-I", "-c", BLOCKER, "--records", "ops.json", "--device", "cpu"]
    out = subprocess.run(
        [*command, "--repeats", "1", "--out", "results.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert all("measured_s" in r for r in results["records"]), results["records"]
    assert "| embedding |" in out.stdout and "| total |" in out.stdout


BLOCKER = """
import importlib.abc, runpy, sys
OURS = {"strategies", "solver", "service", "runtime", "benchmarks", "highspy", "pulp", "ortools", "numba",
        "scipy", "typer", "fastapi", "pydantic", "yaml"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in OURS:
            raise ImportError(f"measure imported {name}")
sys.meta_path.insert(0, Block())
sys.argv = ["compute_calibration.py", "measure", *sys.argv[1:]]
runpy.run_path("compute_calibration.py", run_name="__main__")
"""


def _node(strategies: OpStrategies, op: Any, args: tuple) -> ProblemNode:
    return ProblemNode(
        name=str(op),
        kind="op",
        op=op,
        output_specs=strategies.output_specs,
        input_specs=strategies.input_specs,
        outputs=strategies.outputs,
        compute_s=strategies.compute_s,
        memory_bytes=strategies.memory_bytes,
        call=(args, {}),
    )
