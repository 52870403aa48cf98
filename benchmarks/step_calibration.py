"""Whole training steps on one GPU against what their plans predict: step time and peak memory.

    # here, with autoshard: plan each case on one device of the hardware and write the predictions
    .venv/bin/python benchmarks/step_calibration.py export --hardware h200 \\
        --out benchmarks/data/steps_h200.json
    # on the GPU machine, with torch only (this path imports nothing of autoshard but the model's file)
    python3 benchmarks/step_calibration.py measure --cases benchmarks/data/steps_h200.json --out steps.json

:mod:`benchmarks.compute_calibration` checks the compute model op by op; this checks it whole: one device,
so no collective, every cost is compute and the step is the plan's ``step_time_s`` (the ops' sum divided
by ``sustained_efficiency``, the in-step rate fitted to multi-GPU runs in ``benchmarks/truth.py``). A case
is a built-in Llama 3 shape at fewer layers (one GPU holds them), planned with ``recompute none`` in pure
bf16, as the capture's step runs it: forward, the cross-entropy loss, backward (no optimizer). ``measure``
builds the same module (``strategies/models/llama.py``, loaded by path, so torch is all it needs) on
CUDA, runs warm-up steps, then times each step between CUDA events (median kept) and reads
``torch.cuda.max_memory_allocated`` over one step begun with the gradients freed while torch's fused AdamW
holds its state (two moments in the parameter's dtype, as the plan counts them), against the plan's
``peak_memory_bytes``. Beside it: the AdamW step timed apart (the plan's step has no optimizer) and the peak
over a step with it.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = "autoshard-step-calibration/1"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script on the GPU machine: its sibling below is importable

from benchmarks.compute_calibration import write_results  # noqa: E402  (stdlib only, like this path)

CASES: tuple[dict[str, Any], ...] = (
    {"model": "llama3-8b", "layers": 4, "batch": 2, "seq": 8192},
    {"model": "llama3-8b", "layers": 4, "batch": 4, "seq": 2048},
    {"model": "llama3-8b", "layers": 8, "batch": 1, "seq": 4096},
    {"model": "llama3-70b", "layers": 1, "batch": 1, "seq": 8192},
)
"""Shapes one 141 GB H200 holds without recomputation: long and short sequences, two widths."""


def export(hardware: str, time_limit: float) -> dict[str, Any]:
    """Plan every case on one device of ``hardware``; the cases document ``measure`` reads."""
    from strategies.models.builder import MODELS
    from strategies.plan.planner import PlanRequest, plan_model

    cases = []
    for case in CASES:
        request = PlanRequest(
            model=case["model"],
            mesh="1",
            hardware=hardware,
            batch=case["batch"],
            seq=case["seq"],
            layers=case["layers"],
            recompute="none",
            time_limit=time_limit,
        )
        predicted = plan_model(request).plan["predicted"]
        config = MODELS[case["model"]].config  # type: ignore[attr-defined]
        cases.append(
            {
                **case,
                "config": {
                    **config.__dict__,
                    "n_layers": case["layers"],
                    "max_seq_len": max(case["seq"], 8192),
                },
                "predicted": {
                    k: predicted[k] for k in ("step_time_s", "compute_s", "peak_memory_bytes", "model_flops")
                },
            }
        )
        print(f"{_name(case)}: {predicted['step_time_s'] * 1e3:.1f} ms predicted", file=sys.stderr)
    return {"format": FORMAT, "hardware": hardware, "cases": cases}


@functools.cache
def _llama_module() -> Any:
    """``strategies/models/llama.py`` imported by path with its one sibling, not the package (whose
    ``__init__`` imports the capture and the rest of autoshard); once per process."""
    for package in ("strategies", "strategies.models"):
        sys.modules.setdefault(package, types.ModuleType(package))
    for name in ("options", "llama"):
        spec = importlib.util.spec_from_file_location(
            f"strategies.models.{name}", ROOT / "strategies" / "models" / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["strategies.models.llama"]


def measure_case(case: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    """Time ``case``'s training step on CUDA: median seconds per step and the peak bytes allocated."""
    import torch

    llama = _llama_module()
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = llama.Llama(llama.LlamaConfig(**case["config"]))
    finally:
        torch.set_default_dtype(previous)
    shape = (case["batch"], case["seq"])
    tokens, targets = (torch.randint(case["config"]["vocab_size"], shape, device="cuda") for _ in range(2))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(tokens, targets).backward()

    times = _timed(step, steps, warmup)
    # torch's own AdamW (fused), its two moments in the parameter's dtype, as the plan counts them
    optimizer = torch.optim.AdamW(list(model.parameters()), lr=1e-5, fused=True)
    step()
    optimizer.step()
    optimizer_times = _timed(optimizer.step, steps, warmup)
    peak = _peak(step)  # the plan's step: forward, loss, backward, with the optimizer's state held
    with_optimizer_peak = _peak(lambda: (step(), optimizer.step()))
    measured_s = statistics.median(times)
    optimizer_s = statistics.median(optimizer_times)
    predicted = case["predicted"]
    return {
        **{k: case[k] for k in ("model", "layers", "batch", "seq")},
        "predicted": predicted,
        "measured_s": measured_s,
        "step_times_s": times,
        "optimizer_s": optimizer_s,
        "measured_peak_bytes": peak,
        "with_optimizer_step_peak_bytes": with_optimizer_peak,
        "time_ratio": measured_s / predicted["step_time_s"],
        "peak_ratio": peak / predicted["peak_memory_bytes"],
        "achieved_tflops": predicted["model_flops"] / measured_s / 1e12,
    }


def _timed(fn: Callable[[], Any], steps: int, warmup: int) -> list[float]:
    """Seconds of ``steps`` calls of ``fn`` after ``warmup``, each between CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def _peak(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated over one call of ``fn`` (after the previous call's gradients are freed)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def measure(doc: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    """Every case of ``doc`` measured; a case that fails is reported with its error and the run goes on."""
    import torch

    if doc.get("format") != FORMAT:
        raise ValueError(f"cases: format {doc.get('format')!r}, expected {FORMAT!r}")
    started = time.perf_counter()
    results = []
    for case in doc["cases"]:
        try:
            result = measure_case(case, steps, warmup)
        except Exception as error:  # one case's failure (out of memory, an op missing) is a row of the report
            result = {**{k: case[k] for k in ("model", "layers", "batch", "seq")}, "error": repr(error)[:300]}
        gc.collect()  # the case's model and optimizer, before the next case allocates
        torch.cuda.empty_cache()
        print(row(result), flush=True)
        results.append(result)
    return {
        "format": FORMAT,
        "hardware": doc["hardware"],
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "results": results,
        "seconds": time.perf_counter() - started,
    }


def _name(case: dict[str, Any]) -> str:
    return f"{case['model']} {case['layers']} layers b{case['batch']} s{case['seq']}"


HEADER = (
    "| case | predicted ms | measured ms | meas/pred | TFLOP/s achieved | AdamW step ms | "
    "(step + AdamW)/pred | predicted peak GiB | measured peak GiB | meas/pred | peak, torch's AdamW GiB |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(result: dict[str, Any]) -> str:
    """One Markdown row of the report."""
    if "error" in result:
        return f"| {_name(result)} |" + " - |" * 9 + f" {result['error']} |"
    p = result["predicted"]
    return (
        f"| {_name(result)} | {p['step_time_s'] * 1e3:,.1f} | {result['measured_s'] * 1e3:,.1f} | "
        f"{result['time_ratio']:.2f} | {result['achieved_tflops']:,.0f} | "
        f"{result['optimizer_s'] * 1e3:,.1f} | "
        f"{(result['measured_s'] + result['optimizer_s']) / p['step_time_s']:.2f} | "
        f"{p['peak_memory_bytes'] / 2**30:,.1f} | {result['measured_peak_bytes'] / 2**30:,.1f} | "
        f"{result['peak_ratio']:.2f} | {result['with_optimizer_step_peak_bytes'] / 2**30:,.1f} |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ex = commands.add_parser("export", help="plan the cases and write their predictions (needs autoshard)")
    ex.add_argument("--hardware", default="h200")
    ex.add_argument("--time-limit", type=float, default=60.0, help="solver seconds")
    ex.add_argument("--out", required=True, type=Path)
    me = commands.add_parser("measure", help="time the cases on CUDA (torch only)")
    me.add_argument("--cases", required=True, type=Path)
    me.add_argument("--steps", type=int, default=10, help="timed steps per case")
    me.add_argument("--warmup", type=int, default=3)
    me.add_argument("--out", type=Path, default=None, help="results JSON")
    args = parser.parse_args(argv)
    if args.command == "export":
        doc = export(args.hardware, args.time_limit)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{len(doc['cases'])} cases -> {args.out}")
        return
    print(HEADER, flush=True)
    results = measure(json.loads(args.cases.read_text()), args.steps, args.warmup)
    print(
        f"\n{len(results['results'])} cases on {results['device']}, torch {results['torch']}, "
        f"{results['seconds']:.1f} s"
    )
    write_results(results, args.out)


if __name__ == "__main__":
    main()
