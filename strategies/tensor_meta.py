"""Tensor metadata (shape and dtype) standing in for tensors while planning, and meta execution."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return cls(tuple(int(s) for s in t.shape), t.dtype)

    def __str__(self) -> str:
        return f"{'x'.join(map(str, self.shape)) or 'scalar'}:{dtype_name(self.dtype)}"


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64,
    "long": torch.int64,
    "int32": torch.int32,
    "int": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    key = name.removeprefix("torch.").lower()
    if key not in DTYPES:
        raise ValueError(f"dtype: unknown {name!r}; known: {sorted(set(DTYPES))}")
    return DTYPES[key]


def parse_compute_dtype(name: str | torch.dtype) -> torch.dtype:
    """A mixed-precision compute dtype: a floating one; ValueError naming ``compute_dtype`` otherwise."""
    try:
        dtype = parse_dtype(name)
    except ValueError as error:
        raise ValueError(f"compute_{error}") from None
    if not dtype.is_floating_point:
        raise ValueError(f"compute_dtype: must be a floating dtype, got {dtype_name(dtype)}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def flatten_tensors(tree: Any) -> list[TensorMeta]:
    """The TensorMeta leaves of a nested argument structure, in order."""
    leaves, _ = tree_flatten(tree)
    return [leaf for leaf in leaves if isinstance(leaf, TensorMeta)]


def flatten_outputs(result: Any) -> tuple[TensorMeta | None, ...]:
    """Outputs of an op as TensorMeta, ``None`` for each non-tensor output (SymInt, None)."""
    if isinstance(result, (tuple, list)):
        return tuple(TensorMeta.of(r) if isinstance(r, torch.Tensor) else None for r in result)
    return (TensorMeta.of(result) if isinstance(result, torch.Tensor) else None,)


def meta_outputs(op: Callable, args: tuple, kwargs: dict) -> tuple[TensorMeta | None, ...]:
    """Run ``op`` on meta tensors (fake CPU tensors when it has no meta kernel) to learn its outputs."""

    def on(device: str) -> Callable[[Any], Any]:
        return lambda x: (
            torch.empty(x.shape, dtype=x.dtype, device=device) if isinstance(x, TensorMeta) else x
        )

    meta_kwargs = tree_map(on("meta"), kwargs)
    if not flatten_tensors((args, kwargs)) and _takes_device(op):
        meta_kwargs["device"] = "meta"  # a factory: allocate nothing
    try:
        return flatten_outputs(op(*tree_map(on("meta"), args), **meta_kwargs))
    except (NotImplementedError, RuntimeError):
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True):
            return flatten_outputs(op(*tree_map(on("cpu"), args), **tree_map(on("cpu"), kwargs)))


def _takes_device(op: Callable) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is not None and any(a.name == "device" and a.kwarg_only for a in schema.arguments)
