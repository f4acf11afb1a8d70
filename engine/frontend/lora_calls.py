"""Loading and unloading LoRA adapters across a process boundary: the calls an engine core has not answered
yet, and the adapter list that a restarted core starts from."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable


def with_adapter(modules: tuple[tuple[str, str], ...], name: str, path: str | None) -> tuple[tuple[str, str], ...]:
    """``modules`` (EngineConfig.lora_modules) after loading ``name`` from ``path``, or unloading it (None)."""
    kept = tuple(m for m in modules if m[0] != name)
    return kept if path is None else (*kept, (name, path))


class PendingLoraCalls:
    """Load (a path) or unload (None) calls by ticket, each with the future its caller awaits. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[concurrent.futures.Future[None], str, str | None]] = {}

    def open(self, name: str, path: str | None) -> tuple[int, concurrent.futures.Future[None]]:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._next += 1
            self._waiting[self._next] = (future, name, path)
            return self._next, future

    def close(self, ticket: int, error: BaseException | None, applied: Callable[[str, str | None], None]) -> None:
        """Answer the call ``ticket`` (unknown tickets are ignored). Where it succeeded, ``applied(name, path)``
        runs before its caller wakes, so the caller sees the adapter list that includes its own call."""
        with self._lock:
            entry = self._waiting.pop(ticket, None)
        if entry is None:
            return
        future, name, path = entry
        if error is not None:
            future.set_exception(error)
            return
        applied(name, path)
        future.set_result(None)

    def fail_all(self, error: BaseException) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for future, _, _ in waiting.values():
            future.set_exception(error)
