"""llama3-70b on 256 h100, with and without a pipeline axis: the best plan of each mesh family.

    python benchmarks/pipeline_70b.py [--batch 128] [--seq 8192] [--time-limit 60] [--out DIR]

Each mesh below is planned as a user plans it, ``autoshard plan --model llama3-70b --mesh M --axis-names A
--batch B --seq S`` in a fresh process (wall seconds from start to exit), its plan JSON read back: the
predicted step, tokens per second per GPU, model FLOPs utilisation, peak memory per device and, for a
pipeline, its schedule, micro-batches and bubble. A family is the set of axis names; its best mesh (most
tokens per second) is marked. The meshes are the usual shapes of each family (tensor parallelism inside a
node, at most 8), not every one (``autoshard search --max-mesh-dims 4`` tries them all).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MESHES = [
    ("256", "dp"),
    ("64x4", "dp,tp"),
    ("32x8", "dp,tp"),
    ("16x2x8", "dp,cp,tp"),
    ("8x32", "pp,dp"),
    ("4x8x8", "pp,dp,tp"),
    ("8x4x8", "pp,dp,tp"),
    ("16x2x8", "pp,dp,tp"),
]


def plan(mesh: str, axes: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    autoshard = Path(sys.executable).with_name("autoshard")
    target = out / f"{axes.replace(',', '-')}-{mesh}.json"
    argv = [
        str(autoshard), "plan", "--model", "llama3-70b", "--mesh", mesh, "--axis-names", axes,
        "--batch", str(args.batch), "--seq", str(args.seq), "--time-limit", f"{args.time_limit:g}",
        "--out", str(target), "--quiet",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"mesh": mesh, "axes": axes, "wall_s": wall, "error": done.stderr.strip().splitlines()[-1]}
    document = json.loads(target.read_text())
    predicted, pipeline = document["predicted"], document.get("pipeline")
    step = predicted["step_time_s"]
    return {
        "mesh": mesh,
        "axes": axes,
        "wall_s": wall,
        "step_s": step,
        "tokens_per_gpu_s": args.batch * args.seq / step / 256,
        "mfu": predicted["mfu"],
        "peak_gib": predicted["peak_memory_bytes"] / 2**30,
        "pipeline": None
        if pipeline is None
        else f"{pipeline['schedule']}, {pipeline['microbatches']} x {pipeline['microbatch_size']}, "
        f"bubble {100 * predicted['bubble_s'] / step:.0f}%",
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    best: dict[str, float] = {}
    for row in rows:
        if "error" not in row:
            best[row["axes"]] = max(best.get(row["axes"], 0.0), row["tokens_per_gpu_s"])
    lines = [
        "| axes | mesh | step s | tokens/s per GPU | MFU | peak GiB | pipeline | plan wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['axes']} | {row['mesh']} | {row['error']} | | | | | {row['wall_s']:.1f} |")
            continue
        mark = "**" if row["tokens_per_gpu_s"] == best[row["axes"]] else ""
        lines.append(
            f"| {row['axes']} | {mark}{row['mesh']}{mark} | {row['step_s']:.3f} | "
            f"{mark}{row['tokens_per_gpu_s']:,.0f}{mark} | {100 * row['mfu']:.1f}% | {row['peak_gib']:.1f} | "
            f"{row['pipeline'] or '-'} | {row['wall_s']:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="pipeline-70b-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mesh, axes in MESHES:
        row = plan(mesh, axes, args, out)
        rows.append(row)
        print(f"{axes} {mesh}: {row.get('error') or format(row['step_s'], '.3f') + ' s'}", file=sys.stderr)
    print(f"llama3-70b, 256 x h100, batch {args.batch} x {args.seq}, plans in {out}\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
