"""Stored results kept in memory: a result never changes once stored under its hash, so a cache hit needs
no database round trip after the first. Least recently used entries go first past ``max_bytes``."""

from __future__ import annotations

import threading
from collections import OrderedDict


class PlanCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[str, str] | None:
        """``(kind, document)`` of ``key``, or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, kind: str, document: str) -> None:
        if len(document) > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (kind, document)
            self._bytes += len(document)
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)
