"""Server events as WebSocket text frames.

An audio delta is most of what a spoken reply sends, and nearly all of it is the audio's base64, which
JSON never escapes: a ``Base64`` value that ends an event is put into the frame as it is, where the
encoder would scan and copy it, on the event loop, for every delta.
"""

from __future__ import annotations

import base64
import json
from typing import Any


class Base64(str):
    """Some bytes as base64 text: the characters A-Z, a-z, 0-9, +, / and =, none of which JSON escapes."""

    __slots__ = ()

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview) -> Base64:
        return cls(base64.b64encode(data), "ascii")

    def decoded_size(self) -> int:
        """How many bytes this text encodes (without decoding it)."""
        return len(self) // 4 * 3 - self[-2:].count("=")


def serialize(event: dict[str, Any]) -> tuple[str, int]:
    """The event's text frame and its size in bytes: what ``json.dumps`` writes, without spaces."""
    key = next(reversed(event), None)
    if key is None or not isinstance(event[key], Base64):
        return _dumps(event)
    rest = dict(event)
    last = rest.pop(key)
    head, size = _dumps(rest)
    tail = [json.dumps(key), ':"', last, '"}']  # key: ASCII, as json.dumps escapes it by default
    text = "".join([head[:-1], "," if rest else "", *tail])
    return text, size + len(text) - len(head)


# Built once: json.dumps with options builds an encoder per call, a few microseconds of every event.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"))


def _dumps(event: dict[str, Any]) -> tuple[str, int]:
    text = _COMPACT.encode(event)
    try:
        return text, len(text.encode())
    except UnicodeEncodeError:  # lone surrogates from the client's JSON escapes: send them escaped
        text = _COMPACT_ASCII.encode(event)
        return text, len(text)
