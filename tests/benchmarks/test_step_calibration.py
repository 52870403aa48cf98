"""benchmarks/step_calibration.py: the committed cases are the script's, and ``measure`` builds the planned
module with torch alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.step_calibration import CASES, FORMAT, row
from strategies.models.llama import PRESETS

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_cases_are_the_scripts_with_the_presets_shapes() -> None:
    doc = json.loads((ROOT / "benchmarks" / "data" / "steps_h200.json").read_text())
    assert doc["format"] == FORMAT and doc["hardware"] == "h200"
    assert [{k: c[k] for k in ("model", "layers", "batch", "seq")} for c in doc["cases"]] == list(CASES)
    for case in doc["cases"]:
        preset = PRESETS[case["model"]].__dict__
        assert case["config"] == {**preset, "n_layers": case["layers"], "max_seq_len": 8192}
        predicted = case["predicted"]
        assert 0 < predicted["compute_s"] <= predicted["step_time_s"]
        assert predicted["peak_memory_bytes"] < 141e9  # one H200 holds every case


def test_the_model_loads_by_path_with_nothing_of_autoshard() -> None:
    code = """
import sys, torch
sys.path.insert(0, "benchmarks")
import step_calibration
llama = step_calibration._llama_module()
config = llama.LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, ffn_dim=128)
model = llama.Llama(config)
tokens = torch.randint(96, (2, 16))
model(tokens, tokens).backward()
ours = ("autoshard", "solver", "runtime", "service", "strategies")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ours)
print(loaded, all(p.grad is not None for p in model.parameters()))
"""
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == (
        "['strategies', 'strategies.models', 'strategies.models.llama', 'strategies.models.options'] True"
    )


def test_a_row_reports_ratios_and_a_failed_case_its_error() -> None:
    result = {
        "model": "llama3-8b",
        "layers": 4,
        "batch": 2,
        "seq": 8192,
        "predicted": {"step_time_s": 0.4, "peak_memory_bytes": 2 * 2**30},
        "measured_s": 0.3,
        "optimizer_s": 0.02,
        "achieved_tflops": 500.0,
        "time_ratio": 0.75,
        "measured_peak_bytes": 2**30,
        "peak_ratio": 0.5,
        "with_optimizer_step_peak_bytes": 2**30,
    }
    assert row(result) == (
        "| llama3-8b 4 layers b2 s8192 | 400.0 | 300.0 | 0.75 | 500 | 20.0 | 0.80 | 2.0 | 1.0 | 0.50 | 1.0 |"
    )
    failed = {"model": "llama3-70b", "layers": 1, "batch": 1, "seq": 8192, "error": "OutOfMemoryError()"}
    assert row(failed).endswith("| - | OutOfMemoryError() |") and row(failed).count("|") == 12
