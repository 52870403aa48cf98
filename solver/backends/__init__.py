"""Exact backends for the integer program of `solver.ilp`: CBC (the binary PuLP ships), HiGHS, CP-SAT."""

from __future__ import annotations

from solver.backends.base import Backend, BackendResult, ProgressSink, Started

BACKEND_NAMES = ("cbc", "highs", "cpsat")


def get_backend(name: str) -> Backend:
    """The backend called `name` (one of `BACKEND_NAMES`)."""
    if name == "highs":
        from solver.backends.highs import HighsBackend

        return HighsBackend()
    if name == "cbc":
        from solver.backends.cbc import CbcBackend

        return CbcBackend()
    if name == "cpsat":
        from solver.backends.cpsat import CpSatBackend

        return CpSatBackend()
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")


__all__ = ["BACKEND_NAMES", "Backend", "BackendResult", "ProgressSink", "Started", "get_backend"]
