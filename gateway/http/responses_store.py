"""Answers of /v1/responses kept in memory, for ``previous_response_id`` and GET/DELETE; the oldest go first.

Each entry holds the response body as sent and the conversation it ends, as chat-shaped messages (the
instructions left out: OpenAI does not carry them over to the next response).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]
    conversation: tuple[dict[str, Any], ...]


class ResponseStore:
    """At most ``capacity`` responses; requests parse on worker threads, hence the lock."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a response store holds at least 1 response, got capacity {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        with self._lock:
            self._entries[response_id] = entry
            self._entries.move_to_end(response_id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
