"""No rank holds the whole model: llama3-8b's dimensions (2 layers, vocab 128256: 1.49 G parameters, 2.98 GB
in bf16) built on the meta device and trained one checked step on 4 gloo ranks, each rank making only its own
shards; every rank's largest resident set against the whole model's size.

    .venv/bin/python benchmarks/sharded_init.py [--out results.json]

Two plans on dp=2 x tp=2: autoshard's own under a 4.3 GiB budget (the planner counts AdamW's state, the run
uses SGD) and the hand-written FSDP x TP baseline (which gathers the vocab-sized weights over dp for their
matmuls: 0.5 GiB each, with their unreduced gradients). A whole build for contrast does not fit this machine:
four ranks each holding the model and its one-process twin need 4 x 6 GB. ~4 minutes a plan on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AUTOSHARD = Path(sys.executable).with_name("autoshard")
COMMON = ("--model", "llama3-8b", "--layers", "2", "--batch", "2", "--seq", "16", "--hardware", "cpu")
PLANS = {
    "autoshard, 4.3 GiB budget": ("--memory-gib", "4.3"),
    "fsdp_tp baseline": ("--baseline", "fsdp_tp"),
}
PARAMETERS = 128256 * 4096 * 2 + 2 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
WHOLE_BYTES = 2 * PARAMETERS  # bf16


def measure(name: str, options: tuple[str, ...], folder: Path) -> dict[str, object]:
    plan, report = folder / f"{len(name)}-plan.json", folder / f"{len(name)}-report.json"
    planning = [str(AUTOSHARD), "plan", *COMMON, "--mesh", "2x2", "--axis-names", "dp,tp", *options]
    subprocess.run([*planning, "--out", str(plan), "--quiet"], check=True, capture_output=True)
    started = time.perf_counter()
    running = [str(AUTOSHARD), "run", "--model", "llama3-8b", "--plan", str(plan), "--meta-init", "--check"]
    done = subprocess.run([*running, "--report", str(report)], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return {"plan": name, "failed": done.stderr.strip().splitlines()[-1], "seconds": seconds}
    memory = json.loads(report.read_text(encoding="utf-8"))["memory"]
    resident = memory["max_rss_bytes_per_rank"]
    return {
        "plan": name,
        "checked": True,
        "max_rss_gib_per_rank": [round(r / 2**30, 2) for r in resident],
        "live_peak_gib_per_rank": [round(p / 2**30, 2) for p in memory["peak_bytes_per_rank"]],
        "whole_model_gib": round(WHOLE_BYTES / 2**30, 2),
        "largest_rank_over_whole_model": round(max(resident) / WHOLE_BYTES, 3),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, options in PLANS.items():
            rows.append(measure(name, options, Path(folder)))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
