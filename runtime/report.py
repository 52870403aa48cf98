"""The report of `autoshard run` as people read it: loss per step, step time, collectives vs the plan's."""

from __future__ import annotations

from typing import Any

from strategies.units import bytes_text


def report_text(report: dict[str, Any]) -> str:
    mesh = report["mesh"]
    axes = " x ".join(f"{n}={s}" for n, s in zip(mesh["axis_names"], mesh["shape"], strict=True))
    lines = [
        f"ran {report['model']} on {axes} ({report['world_size']} ranks, {report['backend']}), "
        f"{report['steps']} steps of {report['optimizer']}",
        "",
        "step  loss",
        *(f"{i:>4}  {loss:.6g}" for i, loss in enumerate(report["loss"])),
        "",
        f"step time {report['step_time_s'] * 1e3:.1f} ms (median after the first step)",
        "",
        *(["collectives of rank 0, beside its stages' in the plan:"] if report.get("pipeline") else []),
        _collectives_table(report["collectives"], report["backend"]),
        "",
        _memory_line(report["memory"]),
    ]
    if report.get("pipeline"):
        lines += ["", *_pipeline_lines(report["pipeline"], report["memory"]["peak_bytes_per_rank"])]
    if report["deviations"]:
        lines += ["", f"{len(report['deviations'])} ops came out in other placements than planned:"]
        lines += [
            f"  {d['node']} output {d['output']}: planned {d['planned']}, ran {d['actual']}"
            for d in report["deviations"][:10]
        ]
    drawn = report.get("random_ops", {}).get("ops")
    if drawn:  # which path the random ops took (runtime/random_ops.py)
        ops = ", ".join(f"{count} {op}" for op, count in drawn.items())
        lines += ["", f"random ops: {ops}; {report['random_ops']['path']}"]
    recompute = report.get("recompute", {})
    if recompute.get("values"):
        lines += [
            "",
            f"recomputation: {recompute['values']} values dropped after the forward and made again in the "
            f"backward ({recompute['ops_made_again']} ops run again)",
        ]
    if report["checked"]:
        lines += ["", "check: loss, gradients and parameters equal one process"]
    return "\n".join(lines)


def _runner_line(pipeline: dict[str, Any]) -> str:
    """Whose stages and schedule ran the step: torch's, or this runtime's own loop and why."""
    if pipeline.get("torch_schedule"):
        return f"run by torch.distributed.pipelining: its PipelineStage under {pipeline['torch_schedule']}"
    return f"run by autoshard's own loop (the same order, its own sends): {pipeline['own_loop_because']}"


def _pipeline_lines(pipeline: dict[str, Any], peaks: list[int]) -> list[str]:
    """Per rank of a pipeline: its stages' seconds beside the plan's, its idle time beside the plan's bubble,
    what it sent and held beside the plan's."""
    sent = "as planned" if pipeline["sent_bytes_match"] else "NOT as planned"
    match = pipeline.get("collectives_match")
    collectives = "not in the plan" if match is None else "as planned" if match else "NOT as planned"
    lines = [
        f"pipeline: {pipeline['schedule']}, {pipeline['microbatches']} micro-batches, "
        f"{len(pipeline['stages'])} stages; point-to-point bytes {sent}; every rank's collectives "
        f"(its stages') {collectives}",
        _runner_line(pipeline),
        f"{'rank':>4}  {'stages':<8}{'forward':>10}{'backward':>10}{'plan busy':>11}{'idle':>9}"
        f"{'plan bubble':>13}{'sent':>11}{'plan':>11}{'peak':>11}{'plan':>11}",
    ]
    bubbles = pipeline["predicted_bubble_s"]
    for rank, (entry, peak) in enumerate(zip(pipeline["ranks"], peaks, strict=True)):
        stages = ",".join(map(str, entry["stages"]))
        lines.append(
            f"{rank:>4}  {stages:<8}{sum(entry['forward_s']) * 1e3:>8.1f}ms"
            f"{(sum(entry['backward_s']) + sum(entry.get('weight_s', ()))) * 1e3:>8.1f}ms"
            f"{sum(entry.get('predicted_s', ())) * 1e3:>9.1f}ms"
            f"{entry['idle_s'] * 1e3:>7.1f}ms{bubbles[entry['stages'][0]] * 1e3:>11.1f}ms"
            f"{bytes_text(entry['sent_bytes']):>11}{bytes_text(entry['predicted_sent_bytes']):>11}"
            f"{bytes_text(peak):>11}{bytes_text(entry['predicted_peak_bytes']):>11}"
        )
    if match is False:
        for rank, entry in enumerate(pipeline["ranks"]):
            if entry["collectives"] != entry["predicted_collectives"]:
                lines.append(
                    f"rank {rank} ran collectives {_counts(entry['collectives'])}, "
                    f"its stages plan {_counts(entry['predicted_collectives'])}"
                )
    return lines


def _counts(collectives: dict[str, int]) -> str:
    return ", ".join(f"{count} {name}" for name, count in sorted(collectives.items())) or "none"


def _collectives_table(collectives: dict[str, Any], backend: str) -> str:
    measured, expected = collectives["measured"], collectives["expected_on_backend"]
    if expected is None:  # a pipeline plan made before its stages counted their collectives
        moved = bytes_text(collectives["measured_bytes"])
        return f"collectives: {_counts(measured)}; {moved} (the plan does not say its stages')"
    names = sorted(set(measured) | set(expected) | set(collectives["predicted"]))
    verdict = "as planned" if collectives["match"] else "NOT as planned"
    if not names:
        return f"collectives: none run, none planned ({verdict})"
    rows = [f"{'collective':<16}{'measured':>10}{'plan':>10}{'on ' + backend:>12}"]
    for name in names:
        rows.append(
            f"{name:<16}{measured.get(name, 0):>10}{collectives['predicted'].get(name, 0):>10}"
            f"{expected.get(name, 0):>12}"
        )
    moved = f"{bytes_text(collectives['measured_bytes'])} per rank"
    if collectives.get("predicted_bytes") is not None:
        moved += f", plan {bytes_text(collectives['predicted_bytes'])}"
    return "\n".join([*rows, f"collectives: {verdict}; {moved}"])


def _memory_line(memory: dict[str, Any]) -> str:
    peaks = memory["peak_bytes_per_rank"]
    text = f"peak memory per rank {bytes_text(min(peaks))}"
    text += f" to {bytes_text(max(peaks))}" if max(peaks) != min(peaks) else ""
    predicted = memory["predicted_peak_bytes"]
    if predicted:
        text += f", plan {bytes_text(predicted)} ({100 * memory['largest_over_predicted']:.0f}%)"
    resident = memory.get("max_rss_bytes_per_rank")
    if resident:  # the whole process: Python, torch, transients the tensor count leaves out
        text += f"; largest resident set of a rank {bytes_text(max(resident))}"
    return text
