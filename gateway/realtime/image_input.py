"""``input_image`` content parts: data URIs of PNG, JPEG or WebP, checked once when the item arrives.

The gateway never fetches URLs (a client could make it reach any host) and never decodes pixels
(decoding and its limits belong to the model side); it checks the URI form, the size and the file
signature, so a bad image is refused at ``conversation.item.create`` rather than failing a response later.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from omni_gateway.gateway.realtime.errors import invalid_type, invalid_value

_MIMES = {"image/png": "image/png", "image/jpeg": "image/jpeg", "image/jpg": "image/jpeg", "image/webp": "image/webp"}
_DATA_URI = re.compile(r"^data:([\w.+/-]+);base64,", re.IGNORECASE)
_EXPECTED_URI = "a data:image/png|jpeg|webp;base64,... URI (http(s) URLs are not fetched)"
DETAILS = ("auto", "low", "high")


def sniff(data: bytes) -> str | None:
    """The mime type the bytes' signature says, among the accepted three."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def parse_image_url(url: Any, param: str, max_bytes: int) -> tuple[bytes, str]:
    """A data URI -> (image bytes, mime). Raises RealtimeError naming ``param``."""
    if not isinstance(url, str):
        raise invalid_type(param, "a string", url)
    match = _DATA_URI.match(url)
    if match is None:
        raise invalid_value(param, _EXPECTED_URI, url[:40] + ("..." if len(url) > 40 else ""))
    mime = _MIMES.get(match.group(1).lower())
    if mime is None:
        raise invalid_value(param, _EXPECTED_URI, match.group(0))
    encoded = url[match.end() :]
    if len(encoded) // 4 * 3 > max_bytes + 2:  # refused before decoding: base64 is 4 chars per 3 bytes
        raise invalid_value(param, f"an image of at most {max_bytes} bytes", f"about {len(encoded) // 4 * 3} bytes")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_value(
            param, "valid base64 after 'base64,'", encoded[:32] + ("..." if len(encoded) > 32 else "")
        ) from None
    if len(data) > max_bytes:
        raise invalid_value(param, f"an image of at most {max_bytes} bytes", f"{len(data)} bytes")
    if not data:
        raise invalid_value(param, "a non-empty image", "0 bytes")
    if sniff(data) is None:
        raise invalid_value(param, "PNG, JPEG or WebP image data", data[:8])
    return data, mime


def image_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
