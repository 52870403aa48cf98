"""Hash-once values: meshes and hardware are hashed on every cached cost lookup."""

from __future__ import annotations

import functools
from typing import Any


class HashOnce:
    """Frozen-dataclass mixin: the hash of :meth:`hash_key` is computed once and left out of pickles
    (string hashes differ between processes)."""

    def hash_key(self) -> Any:
        raise NotImplementedError

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @functools.cached_property
    def _hash(self) -> int:
        return hash(self.hash_key())
