"""The human-readable summary of a plan: placements grouped by repeated layer, time, memory, certificate."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from strategies.units import bytes_text

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def summary(plan: dict[str, Any]) -> str:
    """A few screens at most, whatever the depth: layers with the same placements are folded."""
    lines = [_header(plan), "", "parameters (layers with identical placements folded):"]
    lines += _parameter_lines(plan["parameters"])
    lines += ["", f"inputs: {', '.join(_spec(s) for s in plan['inputs'])}", ""]
    lines += _time_lines(plan["predicted"])
    lines += _pipeline_lines(plan)
    lines += _recompute_lines(plan)
    lines += ["", _memory_line(plan), _certificate_line(plan["solver"])]
    for warning in plan.get("warnings", []):
        lines.append(f"warning: {warning}")
    timings = plan.get("timings")
    if timings:
        lines.append("phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    return "\n".join(lines)


def _header(plan: dict[str, Any]) -> str:
    mesh = plan["mesh"]
    axes = " x ".join(f"{n}={s}" for n, s in zip(mesh["axis_names"], mesh["shape"], strict=True))
    request = plan.get("request", {})
    graph = request.get("graph") or {}  # a launcher's graph: its label (the module's class by default)
    model = request.get("model") or (f"the graph {graph['model']!r}" if graph.get("model") else "a graph")
    return f"plan for {model} on {axes} ({mesh.get('hardware', '?')})"


def _parameter_lines(parameters: dict[str, list[str]]) -> list[str]:
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    singles: list[tuple[str, str]] = []
    for name, spec in parameters.items():
        text = _spec(spec)
        match = _LAYER_INDEX.search(name)
        if match:
            pattern = name[: match.start()] + ".{i}." + name[match.end() :]
            groups[(pattern, text)].append(int(match.group(1)))
        else:
            singles.append((name, text))
    rows = [(name, text) for name, text in singles]
    for (pattern, text), layers in groups.items():
        rows.append((pattern.replace("{i}", f"[{layer_ranges(sorted(layers))}]"), text))
    width = max((len(n) for n, _ in rows), default=0)
    return [f"  {name:<{width}}  {text}" for name, text in rows]


def layer_ranges(values: list[int], dash: str = "-", separator: str = ",") -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}{dash}{prev}")
        if v is not None:
            start = prev = v
    return separator.join(parts)


def _time_lines(predicted: dict[str, Any]) -> list[str]:
    step = predicted["step_time_s"]
    comm = predicted["comm_s"]
    exposed = predicted.get("exposed_comm_s", comm)
    lines = [
        f"predicted step time {_ms(step)}: compute {_ms(predicted['compute_s'])}, "
        f"input loading {_ms(predicted.get('load_s', 0.0))}, communication {_ms(comm)} "
        f"({bytes_text(predicted['comm_bytes'])} per device): {_ms(exposed)} exposed, "
        f"{_ms(predicted.get('hidden_comm_s', 0.0))} hidden behind compute"
    ]
    if "mfu" in predicted:
        contention = predicted.get("contention_s", 0.0)
        lines.append(
            f"model FLOPs utilisation {100 * predicted['mfu']:.1f}% "
            f"({predicted.get('model_flops', 0) / 1e12:,.1f} TFLOP per device per step)"
            + (f"; compute slowed {_ms(contention)} by the collectives beside it" if contention > 0 else "")
        )
    collectives = predicted.get("collectives") or {}
    if collectives:
        lines.append("collectives: " + ", ".join(f"{n} x{c}" for n, c in sorted(collectives.items())))
    return lines


def _pipeline_lines(plan: dict[str, Any]) -> list[str]:
    """A pipeline's stages (layers, ranks, bubble, peak), its schedule and its micro-batches."""
    pipeline = plan.get("pipeline")
    if not pipeline:
        return []
    stages = pipeline["stages"]
    step = plan["predicted"]["step_time_s"]
    bubble = plan["predicted"].get("bubble_s", 0.0)
    chunks = pipeline.get("chunks", 1)
    per_rank = f" ({chunks} per rank group)" if chunks > 1 else ""
    lines = [
        f"pipeline: {len(stages)} stages{per_rank} along {pipeline['axis']}, {pipeline['schedule']}, "
        f"{pipeline['microbatches']} micro-batches of {pipeline['microbatch_size']}; bubble {_ms(bubble)} "
        f"({100 * bubble / step:.1f}% of the step) on the most idle stage, "
        f"{bytes_text(pipeline['send_bytes'])} sent between stages per step"
        if step
        else f"pipeline: {len(stages)} stages{per_rank}"
    ]
    for k, stage in enumerate(stages):
        first, end = stage["layers"]
        ranks = stage["ranks"]
        lines.append(
            f"  stage {k}: layers {first}-{end - 1}, ranks {ranks[0]}-{ranks[1] - 1}, "
            f"bubble {_ms(stage['bubble_s'])}, peak {bytes_text(stage['peak_memory_bytes'])}"
        )
    for exchange in pipeline.get("exchanges", []):
        to, made = ", ".join(str(stage) for stage in exchange["to_stages"]), exchange["from_stage"]
        lines.append(
            f"  {exchange['parameter']}: held on stages {made} and {to}; its gradient sent from stage {made} "
            f"once per step ({bytes_text(exchange['bytes'])} per device each)"
        )
    return lines


def _recompute_lines(plan: dict[str, Any]) -> list[str]:
    """What the backward makes again, by op, with the memory it frees and the time it costs."""
    names = plan.get("recompute")
    if names is None:
        return []
    if not names:
        return ["recomputation: none (every value the backward reads is kept)"]
    ops = {node["name"]: node["op"] for node in plan.get("nodes", [])}
    counts: dict[str, int] = defaultdict(int)
    for name in names:
        counts[ops.get(name, "?").removeprefix("aten.").removesuffix(".default")] += 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kinds = ", ".join(f"{op} x{n}" for op, n in ranked[:8]) + (", ..." if len(ranked) > 8 else "")
    predicted = plan["predicted"]
    seconds, step = predicted.get("recompute_s", 0.0), predicted["step_time_s"]
    share = f" ({100 * seconds / step:.1f}% of the step)" if step else ""
    return [
        f"recomputation: {len(names)} values made again in the backward ({kinds})",
        f"  frees {bytes_text(predicted.get('recompute_freed_bytes', 0))} from forward to backward, "
        f"costs {_ms(seconds)}{share}",
    ]


def _memory_line(plan: dict[str, Any]) -> str:
    predicted = plan["predicted"]
    peak = predicted["peak_memory_bytes"]
    budget = plan.get("request", {}).get("memory_gib")
    text = f"peak memory per device {bytes_text(peak)}"
    if budget:
        limit, what = budget * 2**30, f"{budget:g} GiB budget"
    else:
        limit, what = _capacity(plan.get("mesh", {}).get("hardware")), "the device's memory"
    if limit:
        text += f" of {what} ({100 * peak / limit:.0f}%, {bytes_text(max(limit - peak, 0))} left)"
    fastest = predicted.get("fastest")
    if fastest:
        slower = predicted["step_time_s"] / fastest["step_time_s"] - 1 if fastest["step_time_s"] else 0.0
        text += (
            f"; the fastest plan peaks at {bytes_text(fastest['peak_memory_bytes'])} "
            f"({100 * slower:.2f}% faster): this one keeps the headroom"
        )
    return text


def _capacity(hardware: Any) -> float | None:
    """The memory of a plan's hardware preset; None for any other name (a plan from a hardware file: its
    path is never opened here, where the plan may be a client's)."""
    from strategies.cost.hardware import PRESETS

    preset = PRESETS.get(hardware) if isinstance(hardware, str) else None
    return float(preset.memory_bytes) if preset is not None else None


def _certificate_line(solver: dict[str, Any]) -> str:
    gap = solver.get("gap")
    gap_text = "-" if gap is None else f"{100 * gap:.3f}%"
    bound = solver.get("bound")
    bound_text = "-" if bound is None else _ms(bound)
    return (
        f"certificate: {solver['status']} by {solver['backend']}, bound {bound_text}, gap {gap_text}, "
        f"{solver['variables']:,} variables, {solver['seconds']:.2f} s"
    )


def _spec(spec: list[str] | None) -> str:
    return "-" if spec is None else "[" + ", ".join(spec) + "]"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"
