"""Text for the report: every value taken from a search's results made safe for HTML and readable.

Results are read defensively: a field that is missing, ``None`` or not a finite number shows as a dash,
never as a traceback, so the page renders whatever a results file holds.
"""

from __future__ import annotations

import html
import math
from typing import Any

from strategies.units import bytes_text

DASH = "–"


def esc(value: Any) -> str:
    """``value`` as HTML text (quotes escaped too, so it is safe inside attributes)."""
    return html.escape(str(value), quote=True)


def mapping(document: dict[str, Any], key: str) -> dict[str, Any]:
    """``document[key]`` when it is an object, else an empty one."""
    value = document.get(key)
    return value if isinstance(value, dict) else {}


def sequence(document: dict[str, Any], key: str) -> list[Any]:
    """``document[key]`` when it is a list, else an empty one."""
    value = document.get(key)
    return value if isinstance(value, list) else []


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a number (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def count_text(value: Any) -> str:
    """``4096`` -> ``4,096``; a fraction keeps three significant digits; not a number: a dash."""
    count = number(value)
    if count is None:
        return DASH
    return f"{count:,.0f}" if count.is_integer() else f"{count:.3g}"


def seconds_text(value: Any) -> str:
    """``0.000192`` -> ``192 µs``; ``0.0123`` -> ``12.3 ms``: three significant digits."""
    seconds = number(value)
    if seconds is None:
        return DASH
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale or unit == "µs":
            return f"{seconds / scale:.3g} {unit}"
    raise AssertionError("unreachable: µs ends the loop")


def size_text(value: Any) -> str:
    """Bytes as people read them (``1.5 GiB``), or a dash."""
    size = number(value)
    return DASH if size is None else bytes_text(size)


def rate_text(value: Any) -> str:
    """``83291.3`` -> ``83.3 k``: a rate with an SI prefix and three significant digits."""
    rate = number(value)
    if rate is None:
        return DASH
    for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(rate) >= scale:
            return f"{rate / scale:.3g} {prefix}"
    return f"{rate:.3g}"


def percent_text(fraction: Any, digits: int = 2) -> str:
    share = number(fraction)
    return DASH if share is None else f"{100 * share:.{digits}f}%"


def mesh_text(mesh: Any) -> str:
    """``[2, 4]`` -> ``2x4`` (plain text, to be escaped by the caller)."""
    if isinstance(mesh, (list, tuple)) and mesh:
        return "x".join(str(size) for size in mesh)
    return DASH if mesh is None else str(mesh)


def axes_text(names: Any) -> str:
    if isinstance(names, (list, tuple)):
        return ", ".join(str(name) for name in names)
    return DASH if names is None else str(names)


def candidate_label(candidate: dict[str, Any]) -> str:
    """A short label for plots: ``2x4 b16`` (the mesh and the batch, numbers only)."""
    batch = number(candidate.get("batch"))
    batch_text = DASH if batch is None else f"{batch:g}"
    return f"{mesh_text(candidate.get('mesh'))} b{batch_text}"


def throughput(candidate: dict[str, Any]) -> float | None:
    """Tokens per second when the model has a sequence, else samples per second."""
    tokens = number(candidate.get("tokens_per_s"))
    return tokens if tokens is not None else number(candidate.get("samples_per_s"))


def throughput_unit(candidates: list[dict[str, Any]]) -> str:
    """``tokens/s`` when any candidate reports tokens (the model has a sequence), else ``samples/s``."""
    has_tokens = any(number(c.get("tokens_per_s")) is not None for c in candidates)
    return "tokens/s" if has_tokens else "samples/s"
