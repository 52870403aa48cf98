"""How well the per-op compute model predicts kernel times: export a plan's calls here, time them on a GPU.

    # here, with autoshard: plan llama3-8b on 8x8 for h200 and write each device's calls
    .venv/bin/python benchmarks/compute_calibration.py export --model llama3-8b --mesh 8x8 --batch 16 \\
        --seq 8192 --hardware h200 --out benchmarks/data/llama3_8b_8x8_h200_ops.json
    # on the GPU machine, with torch only (this file imports nothing of autoshard on this path)
    python3 benchmarks/compute_calibration.py measure \\
        --records benchmarks/data/llama3_8b_8x8_h200_ops.json --out calibration.json

The model being checked (``strategies/cost/compute.py``): per op on its local shapes, the rate its family
achieves (GEMMs by tile and wave quantisation, flash attention by sequence and head dim, the rest at the
achieved memory rate), divided by the hardware's ``sustained_efficiency`` (the in-step rate): a kernel alone
is predicted at ``predicted_s * sustained_efficiency`` (launch aside).

``export`` (:mod:`benchmarks.calibration_export`) writes one record per distinct call: ``op``
(``aten.mm.default``; ``autoshard.einsum.default`` is our two-operand einsum), ``inputs`` (local shape,
dtype, and ``high``, the exclusive bound of an index tensor's values), ``args``/``kwargs`` (JSON, with
``{"tensor": k}``, ``{"dtype": …}``, ``{"memory_format": …}``, ``{"layout": …}``, ``{"device": null}``
(the measuring device), ``{"float": "inf"}``), the local ``outputs``, ``predicted_s``, ``count`` (nodes
merged) and ``step_weight`` (how many times a training step runs it).

``measure`` rebuilds each call on ``--device`` (``meta``: a dry run that checks every call, as on CUDA,
gives the exported output shapes) with random inputs (index tensors in range, zeros for other
integers) and times it: warm-up calls, then up to ``--repeats`` timed calls within ``--op-seconds``, the
median kept. On CUDA each call is timed by a pair of events queued behind a ``torch.cuda._sleep`` so the
host's dispatch is not counted (kernel time, as the model means it), twice: ``measured`` with the L2 cache
flushed before each call (inputs come from HBM, as the model assumes) and ``warm`` without. On a CPU it is
``time.perf_counter`` around each call (a smoke test). CPU-only ops in the capture run as their CUDA
counterparts (``_scaled_dot_product_flash_attention_for_cpu`` as ``_scaled_dot_product_flash_attention``);
an attention backward first runs its forward on the same inputs so its saved tensors (output, logsumexp,
RNG state) are real. A call that fails is reported with its error; the run goes on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = "autoshard-compute-calibration/1"
FAMILIES = ("matmul", "attention", "pointwise/norm", "other")
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "einsum", "addmv", "mv", "dot"}
POINTWISE_NORM = {
    "_to_copy",
    "copy",
    "sum",
    "mean",
    "amax",
    "amin",
    "var",
    "var_mean",
    "_softmax",
    "_softmax_backward_data",
    "_log_softmax",
    "_log_softmax_backward_data",
    "native_layer_norm",
    "native_layer_norm_backward",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "native_group_norm",
    "native_batch_norm",
    "clone",
    "ones_like",
    "zeros_like",
    "full_like",
    "empty_like",
}
SLEEP_CYCLES = 2_000_000
"""GPU cycles (~1 ms) queued before each timed call, so the host enqueues it before the GPU reaches it."""
FLUSH_BYTES = 256 * 2**20
"""Bytes written before a cold call: several times the L2 (50 MB on an H100/H200)."""


# ------------------------------------------------------------------------------------------- records


def op_family(op: str) -> str:
    """``matmul``, ``attention``, ``pointwise/norm`` (elementwise ops, casts, reductions, softmax, norms)
    or ``other``, from the op's name (and its pointwise tag when torch knows the op)."""
    name = op.split(".")[1] if op.count(".") >= 2 else op
    if name in MATMULS:
        return "matmul"
    if "attention" in name:
        return "attention"
    if name in POINTWISE_NORM or name.removesuffix("_backward") in POINTWISE_NORM:
        return "pointwise/norm"
    try:
        import torch

        if torch.Tag.pointwise in resolve_op(op).tags:
            return "pointwise/norm"
    except (AttributeError, RuntimeError, ValueError):
        pass
    return "other"


def resolve_op(name: str) -> Any:
    """``"aten.mm.default"`` -> ``torch.ops.aten.mm.default``."""
    import torch

    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def decode(value: Any, tensors: list[Any], device: Any) -> Any:
    """The argument a record's JSON stands for (see the module docstring)."""
    import torch

    if isinstance(value, list):
        return [decode(v, tensors, device) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, payload),) = value.items()
    if tag == "tensor":
        return tensors[payload]
    if tag == "float":
        return float(payload)
    if tag == "dtype":
        return getattr(torch, payload)
    if tag in ("memory_format", "layout"):
        return getattr(torch, payload)
    if tag == "device":
        return torch.device(device)
    raise ValueError(f"unknown argument tag {tag!r}")


def make_input(spec: dict[str, Any], device: Any, generator: Any) -> Any:
    """A random tensor for one input: normal floats, indices in ``[0, high)``, zeros for other integers."""
    import torch

    dtype = getattr(torch, spec["dtype"])
    shape = spec["shape"]
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=torch.float32, device=device, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device, generator=generator).bool()
    high = spec.get("high")
    if high is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.randint(0, max(int(high), 1), shape, dtype=dtype, device=device, generator=generator)


# ------------------------------------------------------------------------------------------- calls


def build_call(record: dict[str, Any], device: str, generator: Any) -> tuple[Callable[[], Any], str]:
    """A no-argument callable running the record's call on ``device`` with fresh inputs, and the name of
    what it runs."""
    import torch

    tensors = [make_input(spec, device, generator) for spec in record["inputs"]]
    args = decode(record["args"], tensors, device)
    kwargs = {k: decode(v, tensors, device) for k, v in record["kwargs"].items()}
    op = record["op"]
    cuda = torch.device(device).type in ("cuda", "meta")  # a dry run on meta checks the CUDA calls
    name = op.split(".")[1]
    if op == "autoshard.einsum.default":
        equation, a, b = args
        return (lambda: torch.einsum(equation, a, b).contiguous()), "torch.einsum(...).contiguous()"
    if name == "_scaled_dot_product_flash_attention_for_cpu" and cuda:
        return _flash_forward(args, kwargs), "aten._scaled_dot_product_flash_attention.default"
    if name == "_scaled_dot_product_flash_attention_for_cpu_backward":
        return _flash_backward(args, kwargs, cuda), (
            "aten._scaled_dot_product_flash_attention_backward.default" if cuda else op
        )
    fn = resolve_op(op)
    return (lambda: fn(*args, **kwargs)), op


def _flash_forward(args: list, kwargs: dict) -> Callable[[], Any]:
    """CUDA flash attention for the CPU op's call ``(q, k, v, dropout_p=0, is_causal=False, *, attn_mask,
    scale)``."""
    import torch

    q, k, v = args[:3]
    dropout_p = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
    is_causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
    if kwargs.get("attn_mask") is not None:
        raise ValueError("flash attention on CUDA takes no attn_mask")
    flash = torch.ops.aten._scaled_dot_product_flash_attention.default
    scale = kwargs.get("scale")
    return lambda: flash(q, k, v, dropout_p, is_causal, False, scale=scale)


def _flash_backward(args: list, kwargs: dict, cuda: bool) -> Callable[[], Any]:
    """The CPU op's backward with the saved output and logsumexp of a real forward on the same inputs; on
    CUDA, flash attention's backward with the forward's saved tensors."""
    import torch

    grad, q, k, v, _out, _lse, dropout_p, is_causal = args
    scale = kwargs.get("scale")
    if kwargs.get("attn_mask") is not None:
        raise ValueError("attn_mask is not supported here")
    if cuda:
        saved = _flash_forward([q, k, v, dropout_p, is_causal], {"scale": scale})()
        backward = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset = saved[:8]
        rest = (out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset)
        return lambda: backward(grad, q, k, v, *rest, scale=scale)
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    backward_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    out, lse = forward(q, k, v, dropout_p, is_causal, scale=scale)
    return lambda: backward_cpu(grad, q, k, v, out, lse, dropout_p, is_causal, scale=scale)


def output_mismatch(result: Any, expected: list[dict[str, Any] | None]) -> str | None:
    """``None`` when the call's first outputs have the shapes and dtypes the export expects, else what
    differs."""
    import torch

    got = list(result) if isinstance(result, (tuple, list)) else [result]
    for k, want in enumerate(expected):
        if want is None:
            continue
        if k >= len(got) or not isinstance(got[k], torch.Tensor):
            return f"output {k}: expected a tensor {want['shape']}"
        shape, dtype = list(got[k].shape), str(got[k].dtype).removeprefix("torch.")
        if shape != want["shape"] or dtype != want["dtype"]:
            return f"output {k}: {shape}:{dtype}, expected {want['shape']}:{want['dtype']}"
    return None


# ------------------------------------------------------------------------------------------- timing


class Timer:
    """Median seconds of a call: CUDA events behind a sleep (optionally after an L2 flush) on a GPU,
    ``perf_counter`` on a CPU."""

    def __init__(self, device: str, repeats: int, warmup: int, op_seconds: float) -> None:
        import torch

        self.cuda = torch.device(device).type == "cuda"
        self.repeats, self.warmup, self.op_seconds = repeats, warmup, op_seconds
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if self.cuda else None

    def median(self, fn: Callable[[], Any], cold: bool) -> tuple[float, int]:
        """(median seconds, calls timed)."""
        import torch

        for _ in range(self.warmup):
            fn()
        if self.cuda:
            torch.cuda.synchronize()
        times: list[float] = []
        started = time.perf_counter()
        least = min(3, self.repeats)
        while len(times) < self.repeats and (
            len(times) < least or time.perf_counter() - started < self.op_seconds
        ):
            times.append(self._once(fn, cold))
        return statistics.median(times), len(times)

    def _once(self, fn: Callable[[], Any], cold: bool) -> float:
        import torch

        if not self.cuda:
            begin = time.perf_counter()
            fn()
            return time.perf_counter() - begin
        if cold and self.flush is not None:
            self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


# ------------------------------------------------------------------------------------------- measure


def measure(
    doc: dict[str, Any],
    device: str = "cuda",
    repeats: int = 30,
    warmup: int = 3,
    op_seconds: float = 1.0,
    budget_s: float = 150.0,
    limit: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time every record of ``doc`` (an ``export`` document) on ``device``; the results document."""
    import torch

    if doc.get("format") != FORMAT:
        raise ValueError(f"records: format {doc.get('format')!r}, expected {FORMAT!r}")
    torch.manual_seed(0)
    meta = torch.device(device).type == "meta"  # shapes only: a dry run of every call
    generator = None if meta else torch.Generator(device=device).manual_seed(0)
    timer = Timer(device, repeats, warmup, op_seconds)
    started = time.perf_counter()
    results = []
    records = doc["records"][:limit] if limit is not None else doc["records"]
    references = reference_records(doc.get("hardware"), torch.device(device).type == "cuda")
    for record in [*references, *records]:
        result = {
            k: record[k] for k in ("op", "family", "inputs", "args", "count", "step_weight", "predicted_s")
        }
        result["nodes"] = record.get("nodes", [])
        result.update(record.get("reference", {}))
        if time.perf_counter() - started > budget_s:
            result["error"] = f"not run: the {budget_s:.0f} s budget is spent"
        else:
            result.update(_measure_one(record, device, generator, timer))
        results.append(result)
        if progress is not None:
            progress(_row(result))
    calls = [r for r in results if r["family"] != "reference"]
    return {
        "format": FORMAT,
        "device": device,
        "environment": _environment(device),
        "records": results,
        "peaks": _peaks(results[: len(references)]),
        "totals": _totals(calls),
        "families": {f: _totals([r for r in calls if r["family"] == f]) for f in FAMILIES},
        "export": {
            k: doc.get(k) for k in ("request", "hardware", "mesh", "plan_compute_s", "skipped_compute_s")
        },
        "skipped_at_export": doc.get("skipped_by_op", {}),
        "seconds": time.perf_counter() - started,
    }


def reference_records(hardware: dict[str, Any] | None, cuda: bool) -> list[dict[str, Any]]:
    """Two calls measuring the device's own peaks, predicted by the model with the export's hardware: a
    square bf16 ``mm`` (FLOP-bound; ``n = 8192`` on a GPU, 512 on a CPU) and a bf16 ``clone`` of 1 GiB on
    a GPU, 8 MiB on a CPU (bandwidth-bound: it reads and writes it)."""
    n = 8192 if cuda else 512
    elements = (2**30 if cuda else 2**23) // 2
    flops, moved = 2.0 * n**3, 2.0 * 2 * elements
    peak = (hardware or {}).get("peak_flops", {}).get("bfloat16")
    bandwidth = (hardware or {}).get("memory_bandwidth")
    launch = (hardware or {}).get("launch_s", 0.0)
    mm_s = max(flops / peak, 3 * n * n * 2 / bandwidth) + launch if peak and bandwidth else None
    copy_s = moved / bandwidth + launch if bandwidth else None
    common = {"family": "reference", "kwargs": {}, "count": 1, "step_weight": 0.0, "nodes": []}
    return [
        common
        | {
            "op": "aten.mm.default",
            "inputs": [{"shape": [n, n], "dtype": "bfloat16"}] * 2,
            "args": [{"tensor": 0}, {"tensor": 1}],
            "outputs": [{"shape": [n, n], "dtype": "bfloat16"}],
            "predicted_s": mm_s,
            "reference": {"flops": flops},
        },
        common
        | {
            "op": "aten.clone.default",
            "inputs": [{"shape": [elements], "dtype": "bfloat16"}],
            "args": [{"tensor": 0}],
            "outputs": [{"shape": [elements], "dtype": "bfloat16"}],
            "predicted_s": copy_s,
            "reference": {"bytes": moved},
        },
    ]


def _peaks(references: list[dict[str, Any]]) -> dict[str, float | None]:
    """Achieved bf16 FLOP/s of the reference ``mm`` and bytes/s of the reference ``clone``."""
    mm, copy = references
    return {
        "bf16_flops": mm["flops"] / mm["measured_s"] if "measured_s" in mm else None,
        "memory_bandwidth": copy["bytes"] / copy["measured_s"] if "measured_s" in copy else None,
    }


def _measure_one(record: dict[str, Any], device: str, generator: Any, timer: Timer) -> dict[str, Any]:
    """``ran_as``, ``measured_s``, ``warm_s``, ``calls`` and ``output_error``; or ``error``."""
    import torch

    out: dict[str, Any] = {}
    try:
        fn, out["ran_as"] = build_call(record, device, generator)
        mismatch = output_mismatch(fn(), record["outputs"])
        if mismatch is not None:
            out["output_error"] = mismatch
        if timer.cuda:
            out["warm_s"], _ = timer.median(fn, cold=False)
        out["measured_s"], out["calls"] = timer.median(fn, cold=True)
    except Exception as error:  # one failing call is a row of the report, not the end of the run
        out["error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
        if timer.cuda:
            try:  # free what the failed call held; a broken CUDA context fails the next calls instead
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as late:
                out["error"] += f" (then {type(late).__name__} while cleaning up)"
    return out


def _environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def _totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Step-weighted predicted and measured seconds over the records that ran."""
    ran = [r for r in results if "measured_s" in r]
    predicted = sum(r["step_weight"] * r["predicted_s"] for r in ran)
    measured = sum(r["step_weight"] * r["measured_s"] for r in ran)
    warm = sum(r["step_weight"] * r.get("warm_s", r["measured_s"]) for r in ran)
    return {
        "records": len(results),
        "ran": len(ran),
        "predicted_s": predicted,
        "measured_s": measured,
        "warm_s": warm,
        "ratio": measured / predicted if predicted > 0 else None,
    }


# ------------------------------------------------------------------------------------------- report

COLUMNS = ("op", "local inputs", "count", "weight", "pred us", "meas us", "warm us", "meas/pred")


def _row(r: dict[str, Any]) -> str:
    ran = r.get("ran_as", r["op"])
    op = ran.split(".")[1] if ran.count(".") == 2 else r["op"].split(".")[1]
    if op == "einsum":
        op = f"einsum {r['args'][0]}"
    if r["family"] == "reference":
        op = f"{op} (reference)"
    shapes = ", ".join("x".join(map(str, t["shape"])) or "()" for t in r["inputs"])
    dtypes = sorted({t["dtype"] for t in r["inputs"]})
    cells = [
        op,
        f"{shapes} {'/'.join(dtypes)}",
        str(r["count"]),
        f"{r['step_weight']:g}",
        _us(r["predicted_s"]),
    ]
    if "measured_s" in r:
        ratio = f"{r['measured_s'] / r['predicted_s']:.2f}" if r["predicted_s"] else "-"
        cells += [_us(r["measured_s"]), _us(r.get("warm_s")), ratio]
        if "output_error" in r:
            cells[-1] += f" (outputs differ: {r['output_error']})"
    else:
        cells += ["-", "-", r.get("error", "?")]
    return "| " + " | ".join(cells) + " |"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f}"


def report(results: dict[str, Any]) -> str:
    """The Markdown table, per-family summary and totals of a results document."""
    lines = [
        f"device: {results['device']} {results['environment']}",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += [_row(r) for r in results["records"]]
    peaks = results["peaks"]
    if peaks["bf16_flops"] and peaks["memory_bandwidth"]:
        lines += [
            "",
            f"reference: bf16 mm {peaks['bf16_flops'] / 1e12:,.1f} TFLOP/s, "
            f"clone {peaks['memory_bandwidth'] / 1e9:,.0f} GB/s (read + write)",
        ]
    lines += [
        "",
        "step-weighted totals (sum of step_weight x seconds over the calls that ran):",
        "",
        "| family | calls | ran | predicted ms | measured ms | warm ms | meas/pred |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, t in [*results["families"].items(), ("total", results["totals"])]:
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
        lines.append(
            f"| {name} | {t['records']} | {t['ran']} | {t['predicted_s'] * 1e3:,.2f} | "
            f"{t['measured_s'] * 1e3:,.2f} | {t['warm_s'] * 1e3:,.2f} | {ratio} |"
        )
    failed = [r for r in results["records"] if "error" in r or "output_error" in r]
    lines.append("")
    lines.append(f"{len(failed)} calls failed or gave other outputs; {results['seconds']:.1f} s")
    skipped = results.get("skipped_at_export") or {}
    if skipped:
        lines.append(f"skipped at export (not rebuildable on local shapes): {skipped}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ex = commands.add_parser("export", help="plan a model and write its calls (needs autoshard)")
    ex.add_argument("--model", default="llama3-8b")
    ex.add_argument("--mesh", default="8x8")
    ex.add_argument("--batch", type=int, default=16)
    ex.add_argument("--seq", type=int, default=8192)
    ex.add_argument("--layers", type=int, default=None, help="depth (default the model's)")
    ex.add_argument("--hardware", default="h200")
    ex.add_argument("--dtype", default="bfloat16")
    ex.add_argument("--time-limit", type=float, default=60.0, help="solver seconds")
    ex.add_argument("--option", action="append", default=[], help="model option k=v (e.g. dim=256)")
    ex.add_argument("--out", required=True, type=Path)
    me = commands.add_parser("measure", help="time the exported calls (needs torch only)")
    me.add_argument("--records", required=True, type=Path)
    me.add_argument("--out", type=Path, default=None, help="results JSON")
    me.add_argument("--device", default="cuda")
    me.add_argument("--repeats", type=int, default=30, help="timed calls per op at most")
    me.add_argument("--warmup", type=int, default=3)
    me.add_argument("--op-seconds", type=float, default=1.0, help="timing seconds per op and mode at most")
    me.add_argument("--budget-s", type=float, default=150.0, help="calls not started by then are reported")
    me.add_argument("--limit", type=int, default=None, help="only the first N records")
    args = parser.parse_args(argv)
    if args.command == "export":
        _export(args)
    else:
        _measure(args)


def _export(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.calibration_export import export_records
    from strategies.plan.planner import PlanRequest

    options = {}
    for item in args.option:
        key, _, value = item.partition("=")
        options[key] = json.loads(value)
    request = PlanRequest(
        model=args.model,
        mesh=args.mesh,
        hardware=args.hardware,
        batch=args.batch,
        seq=args.seq,
        layers=args.layers,
        dtype=args.dtype,
        time_limit=args.time_limit,
        options=options,
    )
    doc = export_records(request, lambda message: print(message, file=sys.stderr, flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=None, separators=(",", ":")) + "\n")
    ops = sum(r["count"] for r in doc["records"])
    print(
        f"{len(doc['records'])} calls ({ops} op nodes), {len(doc['skipped'])} skipped "
        f"{doc['skipped_by_op']}, {doc['zero_compute_nodes']} views; predicted compute "
        f"{doc['records_compute_s'] * 1e3:.2f} ms + skipped {doc['skipped_compute_s'] * 1e3:.2f} ms "
        f"= plan {doc['plan_compute_s'] * 1e3:.2f} ms -> {args.out}"
    )


def _measure(args: argparse.Namespace) -> None:
    doc = json.loads(args.records.read_text())
    print(
        f"{len(doc['records'])} calls from {args.records}; {doc.get('request', {}).get('model')}", flush=True
    )
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)
    results = measure(
        doc,
        device=args.device,
        repeats=args.repeats,
        warmup=args.warmup,
        op_seconds=args.op_seconds,
        budget_s=args.budget_s,
        limit=args.limit,
        progress=lambda row: print(row, flush=True),
    )
    print()
    print(report(results))
    write_results(results, args.out)


def write_results(results: dict[str, Any], out: Path | None) -> None:
    """``results`` as JSON at ``out`` (its folder made), said on stdout; nothing without ``out``."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"results -> {out}")


if __name__ == "__main__":
    main()
