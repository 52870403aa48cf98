"""Errors the solver raises for bad input and impossible problems."""

from __future__ import annotations


class ProblemError(ValueError):
    """Malformed problem data; names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InfeasibleError(RuntimeError):
    """No assignment satisfies the constraints; says why (e.g. the smallest reachable peak, ``min_peak``:
    exact, or a lower bound when ``min_peak_exact`` is false)."""

    def __init__(self, message: str, min_peak: int | None = None, min_peak_exact: bool = True) -> None:
        super().__init__(message)
        self.min_peak = min_peak
        self.min_peak_exact = min_peak_exact
