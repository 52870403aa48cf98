"""Checking a built-in model's options before any tensor is built.

Every option is checked by the type its config field declares, so a new field is covered without a new
rule: an ``int`` field takes an int (not a bool, not a float, even an integral one) in ``1..MAX_DIM``; a
``float`` field takes a finite int or float above 0; a ``bool`` field takes a bool. A config's relations
between fields (heads dividing the width, ``top_k <= n_experts``) are checked after, in its
``__post_init__``, and name the option that breaks them. Refusals are :class:`ModelOptionError`, a
ValueError whose text is ``"option: message"``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any

MAX_DIM = 2**31 - 1
"""Largest integer option (and batch, seq, layers): int32's largest, so a product of two fits int64."""


class ModelOptionError(ValueError):
    """A built-in model's option that cannot be used: ``str(error) == f"{option}: {message}"``."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        """The option's name, e.g. ``"n_heads"``."""
        self.message = message
        """What is wrong with it, without the name."""

    def __reduce__(self) -> tuple[type[ModelOptionError], tuple[str, str]]:
        """Pickle by (option, message): the error crosses process boundaries (worker pools)."""
        return type(self), (self.option, self.message)


def check_option(option: str, value: Any, kind: type) -> None:
    """Refuse ``value`` for ``option``, a field of type ``kind`` (int, float or bool), by the rules above."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ModelOptionError(option, f"must be true or false, got {shown(value)}")
    elif kind is int:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise ModelOptionError(option, f"must be an integer in 1..{MAX_DIM}, got {shown(value)}")
    elif kind is float:
        if not isinstance(value, int | float) or isinstance(value, bool) or not _finite_positive(value):
            raise ModelOptionError(option, f"must be a finite number > 0, got {shown(value)}")
    else:
        raise TypeError(f"{option}: no rule for options of type {kind.__name__}")


def check_fields(config: Any) -> None:
    """Check every field of the dataclass ``config`` by its declared type (:func:`check_option`)."""
    for name, kind in field_types(type(config)).items():
        check_option(name, getattr(config, name), kind)


@functools.cache
def field_types(config_class: type) -> dict[str, type]:
    """Field name -> declared type of a config dataclass (annotations resolved once per class)."""
    hints = typing.get_type_hints(config_class)
    return {field.name: hints[field.name] for field in dataclasses.fields(config_class)}


def shown(value: Any) -> str:
    """``value`` for an error message: a number as written (a huge integer by its size), anything else by
    its type only, so a caller's long string is never echoed back."""
    if isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        return str(value) if abs(value) <= 2**64 else f"an integer of {value.bit_length()} bits"
    return f"a {type(value).__name__}"


def _finite_positive(value: int | float) -> bool:
    """Whether ``value`` is above 0 and finite as a float (an int too large for a float is not)."""
    try:
        return value > 0 and math.isfinite(float(value))
    except OverflowError:
        return False
