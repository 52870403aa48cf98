"""Data the tests read, all inside the repository: the IOPDDL example and instance G (Apache-2.0)."""

from __future__ import annotations

from pathlib import Path

IOPDDL = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "iopddl"
EXAMPLE = IOPDDL / "example.json"
INSTANCE_G = IOPDDL / "asplos-2025-iopddl-G.json.gz"
