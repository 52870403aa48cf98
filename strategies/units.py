"""Quantities as people read them: byte counts in B, KiB, MiB, GiB or TiB."""

from __future__ import annotations


def bytes_text(n: float) -> str:
    """``31475202`` -> ``"30.0 MiB"``: the largest binary unit under which ``n`` is at least 1."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable: TiB ends the loop")
