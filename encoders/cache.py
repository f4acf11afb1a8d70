"""Encoder output cache: a repeated image or video frame is encoded once.

Keys are content hashes (``content_key``): sha256 over the decoded pixels, their shape and mode and
the preprocessing settings, so the same picture sent as PNG and as JPEG-decoded-identically hits,
while a resized or differently processed one does not. Entries are evicted least recently used
once their bytes exceed the budget.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any


def content_key(*parts: bytes | str) -> str:
    """Hex sha256 over length-prefixed parts (so no two part lists collide by concatenation)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def image_key(image: Any, settings: str) -> str:
    """Content key of a decoded ``PIL.Image`` under the given preprocessing settings."""
    return content_key(b"image", image.mode, f"{image.width}x{image.height}", image.tobytes(), settings)


def frames_key(frame_keys: Iterable[str], settings: str) -> str:
    return content_key(b"frames", *frame_keys, settings)


class EncoderCache:
    """Thread-safe LRU map from content key to encoder output, bounded by ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: str, value: Any, num_bytes: int) -> None:
        """Store ``value``; one larger than the whole budget is not kept at all."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if num_bytes > self.max_bytes:
                return
            self._entries[key] = (value, num_bytes)
            self._bytes += num_bytes
            while self._bytes > self.max_bytes:
                _, (_, size) = self._entries.popitem(last=False)
                self._bytes -= size
