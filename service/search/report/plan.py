"""The winner's plan in the report: placements folded by layer, collectives, memory over the step.

Parameters named ``<stack>.<i>.<rest>`` (``layers.3.attention.wq.weight``) are grouped by layer; layers
whose parameters take the same placements form one row group with their layer range, so a 32-layer model
reads as a few groups (typically the first layer, the middle ones, the last), as :mod:`service.plan_view`
folds them in text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from service.plan_view import layer_ranges
from service.search.report.format import (
    DASH,
    count_text,
    esc,
    mapping,
    number,
    percent_text,
    rate_text,
    seconds_text,
    sequence,
    size_text,
    throughput,
)
from service.search.report.plots import memory_profile_plot

_LAYER_NAME = re.compile(r"^(?P<stack>(?:[^.]+\.)*?)(?P<index>\d+)\.(?P<rest>.+)$")
"""``layers.3.attention.wq.weight`` -> stack ``layers.``, index 3, rest ``attention.wq.weight`` (the
first numbered part, so ``layers.3.experts.5.w1`` belongs to layer 3)."""

Pattern = tuple[tuple[str, str], ...]
"""A layer's parameters (name within the layer, placement text), in name order."""


@dataclass
class LayerGroup:
    """Layers of one stack whose parameters take the same placements."""

    stack: str
    layers: list[int]
    pattern: Pattern


def fold_layers(parameters: dict[str, Any]) -> list[tuple[str, str] | LayerGroup]:
    """Parameters in plan order, a stack's numbered layers folded into groups of identical placements
    (ordered by their first layer, where the stack first appears); other parameters stay single
    ``(name, placement)`` rows."""
    singles: list[tuple[str, str] | str] = []
    stacks: dict[str, dict[int, list[tuple[str, str]]]] = {}
    for name, spec in parameters.items():
        match = _LAYER_NAME.match(str(name))
        if match is None:
            singles.append((str(name), spec_text(spec)))
            continue
        stack = match["stack"]
        if stack not in stacks:
            stacks[stack] = {}
            singles.append(stack)
        stacks[stack].setdefault(int(match["index"]), []).append((match["rest"], spec_text(spec)))
    rows: list[tuple[str, str] | LayerGroup] = []
    for item in singles:
        if isinstance(item, tuple):
            rows.append(item)
            continue
        by_pattern: dict[Pattern, list[int]] = {}
        for index, entries in sorted(stacks[item].items()):
            by_pattern.setdefault(tuple(sorted(entries)), []).append(index)
        groups = [LayerGroup(item, layers, pattern) for pattern, layers in by_pattern.items()]
        rows += sorted(groups, key=lambda group: group.layers[0])
    return rows


def spec_text(spec: Any) -> str:
    """``["S(0)", "R"]`` -> ``[S(0), R]`` (plain text); ``None`` (no tensor) -> a dash."""
    if isinstance(spec, (list, tuple)):
        return "[" + ", ".join(str(entry) for entry in spec) + "]"
    return DASH if spec is None else str(spec)


def winner_section(
    candidate: dict[str, Any], plan: dict[str, Any] | None, plan_problem: str | None, unit: str
) -> str:
    """The winner's headline figures (throughput in ``unit``) and, when its plan file could be read, the
    plan's summary."""
    parts = [_headline(candidate, unit)]
    if plan is None:
        parts.append(f'<p class="note">{esc(plan_problem or "The winner has no plan file.")}</p>')
        return "\n".join(parts)
    predicted = mapping(plan, "predicted")
    parts += [
        _placements(plan),
        *([_stages(mapping(plan, "pipeline"))] if mapping(plan, "pipeline") else []),
        _collectives(predicted),
        _memory(predicted, number(candidate.get("memory_budget_bytes"))),
    ]
    warnings = plan.get("warnings")
    if isinstance(warnings, list) and warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
        parts.append(f'<h3>Warnings of the planner</h3><ul class="warnings">{items}</ul>')
    return "\n".join(parts)


def _headline(candidate: dict[str, Any], unit: str) -> str:
    certificate = mapping(candidate, "certificate")
    peak, budget = number(candidate.get("peak_memory_bytes")), number(candidate.get("memory_budget_bytes"))
    share = f" ({100 * peak / budget:.0f}%)" if peak is not None and budget else ""
    facts = [
        ("predicted step time", seconds_text(candidate.get("step_time_s"))),
        ("predicted throughput", f"{rate_text(throughput(candidate))} {unit}"),
        ("peak memory per device", f"{size_text(peak)} of {size_text(budget)}{share}"),
        ("certificate", f"{certificate.get('status', DASH)}, gap {percent_text(certificate.get('gap'))}"),
        ("solver", certificate.get("backend", DASH)),
    ]
    cells = "".join(f'<div class="fact"><span>{esc(k)}</span><b>{esc(v)}</b></div>' for k, v in facts)
    return f'<div class="facts">{cells}</div>'


def _placements(plan: dict[str, Any]) -> str:
    mesh = mapping(plan, "mesh")
    axes = ", ".join(str(a) for a in mesh.get("axis_names") or [])
    parameters = mapping(plan, "parameters")
    rows = fold_layers(parameters)
    folded = any(isinstance(row, LayerGroup) for row in rows)
    body: list[str] = []
    for row in rows:
        if isinstance(row, LayerGroup):
            label = f"{row.stack.rstrip('.')} {layer_ranges(row.layers, '–', ', ')}"
            for k, (rest, text) in enumerate(row.pattern):
                head = f'<td rowspan="{len(row.pattern)}" class="layers">{esc(label)}</td>' if k == 0 else ""
                body.append(_placement_row(head, rest, text, first=k == 0))
        else:
            body.append(_placement_row('<td class="layers"></td>' if folded else "", *row, first=True))
    inputs = sequence(plan, "inputs")
    for k, spec in enumerate(inputs):
        head = '<td class="layers"></td>' if folded else ""
        body.append(_placement_row(head, f"input {k}", spec_text(spec), first=True))
    layers_head = "<th>layers</th>" if folded else ""
    return (
        f"<h3>Placements by layer</h3>{_capture_note(plan.get('layers'))}"
        f'<table class="placements"><thead><tr>{layers_head}<th>parameter</th>'
        f"<th>placement per mesh axis ({esc(axes)})</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _placement_row(head: str, name: str, text: str, first: bool) -> str:
    """One parameter's row; ``head`` is the layer-range cell (or nothing), ``first`` starts a group."""
    css = ' class="group-start"' if first else ""
    return f"<tr{css}>{head}<td>{esc(name)}</td><td>{placement_html(text)}</td></tr>"


def _capture_note(layers: Any) -> str:
    if not isinstance(layers, dict):
        return ""
    captured, total = number(layers.get("captured")), number(layers.get("total"))
    if captured is None or total is None:
        return ""
    return (
        f'<p class="note">Planned on a capture of {captured:g} of the {total:g} layers: the first, tied '
        "middle copies standing for every middle layer, and the last.</p>"
    )


def placement_html(text: str) -> str:
    """``[S(0), R]`` with each entry coloured by kind: shard, replicate, partial."""
    if not (text.startswith("[") and text.endswith("]")):
        return f'<span class="spec">{esc(text)}</span>'
    entries = [entry.strip() for entry in text[1:-1].split(",")]
    kinds = {"S": "shard", "R": "replicate", "P": "partial"}
    spans = ", ".join(f'<span class="{kinds.get(e[:1], "other")}">{esc(e)}</span>' for e in entries)
    return f'<span class="spec">[{spans}]</span>'


def _stages(pipeline: dict[str, Any]) -> str:
    """A pipeline's stages: the layers each runs, on which ranks, its rank group's bubble and peak, and what
    one micro-batch sends over the cut after it."""
    rows = []
    for k, stage in enumerate(pipeline.get("stages") or []):
        first, end = (stage.get("layers") or [None, None])[:2]
        low, high = (stage.get("ranks") or [None, None])[:2]
        sends = stage.get("send_bytes") or [0, 0]
        rows.append(
            f'<tr><td class="num">{k}</td><td>{esc(f"{first} to {end - 1}" if end else DASH)}</td>'
            f"<td>{esc(f'{low} to {high - 1}' if high else DASH)}</td>"
            f'<td class="num">{esc(seconds_text(stage.get("bubble_s")))}</td>'
            f'<td class="num">{esc(size_text(stage.get("peak_memory_bytes")))}</td>'
            f'<td class="num">{esc(size_text(sends[0]))} / {esc(size_text(sends[1]))}</td></tr>'
        )
    microbatches = count_text(pipeline.get("microbatches"))
    size = count_text(pipeline.get("microbatch_size"))
    return (
        f"<h3>Pipeline stages</h3><p>{esc(str(pipeline.get('schedule', DASH)))}, {esc(microbatches)} "
        f"micro-batches of {esc(size)} sequences along "
        f"<code>{esc(str(pipeline.get('axis', 'pp')))}</code>.</p>"
        '<table class="stages"><thead><tr><th>stage</th><th>layers</th><th>ranks</th><th>bubble</th>'
        "<th>peak memory</th><th>sent per micro-batch, forward / backward</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _collectives(predicted: dict[str, Any]) -> str:
    collectives = mapping(predicted, "collectives")
    rows = "".join(
        f'<tr><td>{esc(kind)}</td><td class="num">{esc(count_text(count))}</td></tr>'
        for kind, count in sorted(collectives.items(), key=lambda kv: -(number(kv[1]) or 0))
    )
    if not rows:
        rows = '<tr><td colspan="2">no collectives: every tensor stays where it is made</td></tr>'
    times = ", ".join(
        f"{label} {seconds_text(predicted.get(key))}"
        for label, key in (("communication", "comm_s"), ("compute", "compute_s"), ("input loading", "load_s"))
    )
    return (
        "<h3>Collectives per step</h3>"
        f"<p>{esc(size_text(predicted.get('comm_bytes')))} sent or received per device; {esc(times)}.</p>"
        '<table class="collectives"><thead><tr><th>collective</th><th>count</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def _memory(predicted: dict[str, Any], budget: float | None) -> str:
    profile = predicted.get("memory_profile")
    plot = memory_profile_plot(profile, budget) if isinstance(profile, dict) else None
    if plot is None:
        peak = esc(size_text(predicted.get("peak_memory_bytes")))
        plot = (
            '<p class="note">This plan has no memory profile (<code>predicted.memory_profile</code>), so '
            f"memory over the step cannot be drawn; its predicted peak is {peak} per device.</p>"
        )
    return f"<h3>Memory over the step</h3>{plot}"
