"""Placements as small integers, one per mesh axis.

A tensor's placement on an N-D mesh is a tuple of N codes (a *spec*), one per mesh axis:

- ``d >= 0``  ``Shard(d)``, written ``S(d)``
- ``R``       ``Replicate()``
- ``P``       ``Partial("sum")``; ``P_AVG``, ``P_MAX``, ``P_MIN`` for the other reductions
- ``P_MASK``  DTensor's masked partial sum (a row-wise sharded embedding's output, ``P(mask)``): it
              reduces like ``P`` but no op reads it as ``P``, so consumers always reduce it first
- ``NONE``    only inside strategy rows: the slot is not a tensor (a non-tensor output), or an input
              the strategy does not read (any placement will do); written ``*``

Integers keep whole strategy lists in numpy arrays (``[strategy, tensor, axis]``) so costs and
filters are computed vectorised. Text follows docs/plan-format.md (``["S(0)", "R"]``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

R = -1
P = -2
P_AVG = -3
P_MAX = -4
P_MIN = -5
P_MASK = -6
NONE = -100

Spec = tuple[int, ...]

PARTIALS = (P, P_AVG, P_MAX, P_MIN)
LINEAR_PARTIALS = (P, P_AVG)
_PARTIAL_TEXT = {P: "P", P_AVG: "P(avg)", P_MAX: "P(max)", P_MIN: "P(min)", P_MASK: "P(mask)"}
_TEXT_PARTIAL = {"P": P, "P(sum)": P, "P(avg)": P_AVG, "P(max)": P_MAX, "P(min)": P_MIN, "P(mask)": P_MASK}
_REDUCE_OP = {P: "sum", P_AVG: "avg", P_MAX: "max", P_MIN: "min"}
_SHARD_TEXT = re.compile(r"^S\((\d+)\)$")


def is_shard(code: int) -> bool:
    return code >= 0


def is_partial(code: int) -> bool:
    return code in PARTIALS or code == P_MASK


def code_text(code: int) -> str:
    """``2`` -> ``"S(2)"``, ``R`` -> ``"R"``, ``P`` -> ``"P"``."""
    if code >= 0:
        return f"S({code})"
    if code == R:
        return "R"
    if code in _PARTIAL_TEXT:
        return _PARTIAL_TEXT[code]
    if code == NONE:
        return "*"
    raise ValueError(f"not a placement code: {code}")


def spec_text(spec: Iterable[int]) -> list[str]:
    return [code_text(int(c)) for c in spec]


def parse_code(text: str, *, unread: bool = False) -> int:
    """The inverse of :func:`code_text`; also accepts ``Shard(1)``/``Replicate()``/``Partial()``. ``*``
    (``NONE``) only with ``unread``: it is a strategy's mark for an input the op does not read, which a plan
    writes in its op nodes' inputs, never a placement a tensor can be given."""
    t = text.strip().replace(" ", "")
    if t == "*" and unread:
        return NONE
    if t in ("R", "Replicate()"):
        return R
    if t in _TEXT_PARTIAL:
        return _TEXT_PARTIAL[t]
    if t == "Partial()":
        return P
    m = _SHARD_TEXT.match(t.replace("Shard", "S"))
    if m:
        return int(m.group(1))
    raise ValueError(f"not a placement: {text!r} (expected S(d), R, P, P(avg), P(max) or P(min))")


def parse_spec(texts: Sequence[str], *, unread: bool = False) -> Spec:
    return tuple(parse_code(t, unread=unread) for t in texts)


def to_dtensor(spec: Iterable[int]) -> tuple:
    """DTensor placement objects for a spec."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    out = []
    for c in spec:
        c = int(c)
        if c >= 0:
            out.append(Shard(c))
        elif c == R:
            out.append(Replicate())
        elif c in _REDUCE_OP:
            out.append(Partial(_REDUCE_OP[c]))
        elif c == P_MASK:
            raise ValueError("P(mask) is an output placement only (DTensor builds it in embedding)")
        else:
            raise ValueError(f"not a placement code: {c}")
    return tuple(out)


def from_dtensor(placements: Iterable) -> Spec:
    """Codes for DTensor placements (``Shard``, ``Replicate``, ``Partial``)."""
    out = []
    for p in placements:
        if p.is_shard():
            out.append(int(p.dim))
        elif p.is_replicate():
            out.append(R)
        elif type(p).__name__ == "_MaskPartial":
            out.append(P_MASK)
        elif p.is_partial():
            op = getattr(p, "reduce_op", "sum")
            out.append({v: k for k, v in _REDUCE_OP.items()}[op])
        else:
            raise ValueError(f"unsupported placement {p!r}")
    return tuple(out)
