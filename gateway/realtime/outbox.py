"""Server events waiting for the socket: serialized in the order the session produced them, bounded by
count and bytes, each with the time it was queued so the writer knows how long the oldest has waited."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from omni_gateway.gateway.realtime.frames import serialize


class Outbox:
    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.bytes = 0
        self._queue: deque[tuple[str, int, float] | None] = deque()  # (text, bytes, queued at); None: the end
        self._has_data = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, event: dict[str, Any]) -> None:
        text, size = serialize(event)
        self._queue.append((text, size, time.monotonic()))
        self.bytes += size
        self._has_data.set()
        if self.over_bound:
            self._space.clear()

    def end(self) -> None:
        """The writer stops after sending what is queued now."""
        self._queue.append(None)
        self._has_data.set()

    @property
    def over_bound(self) -> bool:
        """Over either bound. One event alone is never over the byte bound: a single large event (a long
        audio item retrieved) says nothing about how the client reads."""
        return len(self._queue) > self.max_events or (self.bytes > self.max_bytes and len(self._queue) > 1)

    async def get(self) -> tuple[str, float] | None:
        """The oldest event and when it was queued; None at the end."""
        while not self._queue:
            self._has_data.clear()
            await self._has_data.wait()
        item = self._queue.popleft()
        if item is None:
            return None
        self.bytes -= item[1]
        if len(self._queue) <= self.max_events // 2 and self.bytes <= self.max_bytes // 2:
            self._space.set()
        return item[0], item[2]

    async def space(self) -> None:
        """Returns once the outbox has drained to half its bound (at once when it is not over it)."""
        await self._space.wait()
