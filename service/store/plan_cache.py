"""Stored results kept in memory: a result never changes once stored under its hash, so a cache hit needs
no database round trip after the first. Each entry remembers the principals known to may read it (a miss
for another principal asks the database). Least recently used entries go first past ``max_bytes``."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class _Entry:
    kind: str
    document: str
    readers: set[str] = field(default_factory=set)


class PlanCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str, reader: str | None) -> tuple[str, str] | None:
        """``(kind, document)`` of ``key`` when ``reader`` is known to may read it (None: anyone), else
        None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or (reader is not None and reader not in entry.readers):
                return None
            self._entries.move_to_end(key)
            return entry.kind, entry.document

    def put(self, key: str, kind: str, document: str, reader: str | None) -> None:
        if len(document) > self.max_bytes:
            return
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(kind, document)
                self._bytes += len(document)
            if reader is not None:
                entry.readers.add(reader)
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped.document)

    def discard(self, keys: list[str]) -> None:
        """Forget ``keys`` (their results were deleted by the retention)."""
        with self._lock:
            for key in keys:
                dropped = self._entries.pop(key, None)
                if dropped is not None:
                    self._bytes -= len(dropped.document)
