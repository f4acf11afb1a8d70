"""Input rows that reach a running sequence while it generates (a talker's per-step thinker states).

Row ``i`` belongs to token position ``start + i``. The producer appends rows from any thread; once it
closes the stream, every later position takes the ``fill`` row. A sequence whose next position has no
row yet is not scheduled (it waits, keeping its KV blocks); the engine loop that runs it ``listen``s, so
an arrival wakes it rather than a poll. Rows are opaque here (torch tensors in practice): the runner
stacks them and the model decides how they combine with the token embeddings. No torch in this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class InputStream:
    def __init__(self, start: int) -> None:
        if start < 0:
            raise ValueError(f"an input stream starts at a position >= 0, got {start}")
        self.start = start
        self._rows: list[Any] = []
        self._fill: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def listen(self, arrived: Callable[[], None]) -> None:
        """Call ``arrived()`` (from the producer's thread) after every later ``append`` and ``close``."""
        with self._lock:
            self._listeners.append(arrived)

    def append(self, rows: list[Any]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("input stream is closed")
            self._rows.extend(rows)
            listeners = tuple(self._listeners)
        for arrived in listeners:
            arrived()

    def close(self, tail: list[Any], fill: Any) -> None:
        """Append the last rows ``tail``; every position after them takes ``fill``."""
        with self._lock:
            if self._closed:
                raise RuntimeError("input stream is closed")
            self._rows.extend(tail)
            self._fill = fill
            self._closed = True
            listeners = tuple(self._listeners)
        for arrived in listeners:
            arrived()

    @property
    def closed(self) -> bool:
        return self._closed

    def ready(self, end: int) -> bool:
        """Whether every position below ``end`` has its row."""
        with self._lock:
            return self._closed or end <= self.start + len(self._rows)

    def rows(self, start: int, end: int) -> list[Any]:
        """The rows of positions ``[max(start, self.start), end)``; raises if one has not arrived."""
        lo = max(start, self.start)
        with self._lock:
            have = len(self._rows)
            if not self._closed and end > self.start + have:
                raise RuntimeError(f"input row for position {self.start + have} has not arrived")
            return [self._rows[p - self.start] if p - self.start < have else self._fill for p in range(lo, end)]
