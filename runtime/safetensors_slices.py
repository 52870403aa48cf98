"""Slices of the tensors of a safetensors file, read with plain reads a block of rows at a time.

``safetensors.safe_open`` maps the file: slicing a tensor along a later dim (a column shard) touches every
page of it, and every touched page of a mapping counts in the process's resident set while it is mapped, so a
rank reading a quarter of an embedding table's columns held the whole table. Here the file is read with
``os.pread`` into a buffer of at most :data:`BLOCK_BYTES` of whole rows (dim 0) of the tensor, the slice's
columns are copied out and the buffer goes: a rank holds its slice and one block, and reads only the rows
its slice needs. The format: an 8-byte little-endian header length, a JSON header (per tensor its dtype,
shape and byte offsets into the data that follows), the data.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

#: Largest buffer of whole rows read at once.
BLOCK_BYTES = 64 << 20

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in the file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    """Byte offset of its first element in the file."""


def entries(path: str | Path) -> dict[str, Entry]:
    """Every tensor of the file by name."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    found = {}
    for name, fields in header.items():
        if name == "__metadata__":
            continue
        if fields["dtype"] not in DTYPES:
            raise ValueError(
                f"weights: {name} in {path} has dtype {fields['dtype']}, which torch cannot read"
            )
        found[name] = Entry(
            DTYPES[fields["dtype"]], tuple(fields["shape"]), 8 + length + fields["data_offsets"][0]
        )
    return found


def read(path: str | Path, entry: Entry, slices: tuple[slice, ...] | None = None) -> torch.Tensor:
    """``tensor[slices]`` (the whole tensor without ``slices``) of the tensor at ``entry``."""
    shape = entry.shape
    if not shape:  # a scalar
        return _rows(path, entry, 0, 1).reshape(())
    slices = slices or tuple(slice(0, size) for size in shape)
    rows, rest = slices[0], (slice(None), *slices[1:])
    row_bytes = math.prod(shape[1:]) * entry.dtype.itemsize
    per_block = max(1, BLOCK_BYTES // max(1, row_bytes))
    pieces = [
        _rows(path, entry, first, min(first + per_block, rows.stop))[rest].clone()
        for first in range(rows.start, rows.stop, per_block)
    ]
    if not pieces:
        empty = [0 if k == 0 else len(range(*s.indices(shape[k]))) for k, s in enumerate(slices)]
        return torch.empty(empty, dtype=entry.dtype)
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


def _rows(path: str | Path, entry: Entry, first: int, last: int) -> torch.Tensor:
    """Rows ``first`` to ``last`` (dim 0) of the tensor, whole."""
    row_bytes = math.prod(entry.shape[1:]) * entry.dtype.itemsize
    count = (last - first) * row_bytes
    buffer = bytearray(count)
    view = memoryview(buffer)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < count:  # straight into the buffer; a read may return fewer bytes than asked
            got = os.preadv(descriptor, [view[done:]], entry.start + first * row_bytes + done)
            if got == 0:
                raise ValueError(f"weights: {path} ends inside a tensor")
            done += got
    finally:
        os.close(descriptor)
    values = torch.frombuffer(buffer, dtype=entry.dtype) if count else torch.empty(0, dtype=entry.dtype)
    return values.view(last - first, *entry.shape[1:])


__all__ = ["BLOCK_BYTES", "Entry", "entries", "read"]
