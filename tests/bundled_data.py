"""Data the tests read, all inside the repository: the IOPDDL example and instance G (Apache-2.0), and a
memory-tight plan problem of our own."""

from __future__ import annotations

from pathlib import Path

IOPDDL = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "iopddl"
EXAMPLE = IOPDDL / "example.json"
INSTANCE_G = IOPDDL / "asplos-2025-iopddl-G.json.gz"
#: The zoo's 2-layer ViT (`tests/strategies/models/user_models/zoo.py:vit`) on a 2x2 mesh (dp, tp) with half
#: its DDP peak per device as the budget, as IOPDDL JSON: `python benchmarks/tight.py --models vit --save
#: tests/data` writes it again.
VIT_HALF_MEMORY = Path(__file__).resolve().parent / "data" / "vit-2x2-half-memory.json.gz"
