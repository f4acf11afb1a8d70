"""Conversation items: parsing client items, the ordered store, rendering per dialect.

Items are kept in their canonical (GA) form; only rendering differs between dialects. User audio is
kept as 24 kHz pcm16 so it can be transcribed, retrieved and handed to the model.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_type, invalid_value, missing
from omni_gateway.gateway.realtime.image_input import DETAILS, image_url, parse_image_url
from omni_gateway.gateway.realtime.settings import Dialect

_BETA_CONTENT = {"output_text": "text", "output_audio": "audio"}
_ROLE_CONTENT = {
    "user": ("input_text", "input_audio", "input_image"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}


@dataclass(slots=True)
class Content:
    type: str  # input_text | input_audio | input_image | output_text | output_audio
    text: str | None = None
    transcript: str | None = None
    audio: bytes | bytearray | None = None  # 24 kHz pcm16
    # Input images keep their decoded bytes only (the data URI is rebuilt when rendered): half the memory.
    image: bytes | None = None
    mime: str | None = None
    detail: str | None = None
    # Output audio: (byte offset where a chunk's audio ends, transcript length after it), for truncation.
    marks: list[tuple[int, int]] = field(default_factory=list)

    def render(self, dialect: Dialect, audio_format: str | None) -> dict[str, Any]:
        kind = _BETA_CONTENT.get(self.type, self.type) if dialect == "beta" else self.type
        out: dict[str, Any] = {"type": kind}
        if self.type in ("input_text", "output_text"):
            out["text"] = self.text or ""
        elif self.type in ("input_audio", "output_audio"):
            out["transcript"] = self.transcript
            if audio_format is not None and self.audio is not None:
                encoded = audio_fmt.encode(self.audio, cast(audio_fmt.AudioFormat, audio_format))
                out["audio"] = base64.b64encode(encoded).decode()
        else:  # dropped under the session's image budget: the part stays, without its image
            out["image_url"] = image_url(self.image, self.mime or "image/png") if self.image is not None else None
            out["detail"] = self.detail or "auto"
        return out


def audio_bytes(content: Content) -> int:
    """Length of a part's audio; output audio remembers it in its marks even after the bytes are dropped."""
    if content.marks:
        return content.marks[-1][0]
    return len(content.audio or b"")


def truncate(content: Content, end_bytes: int) -> None:
    """Keep the first ``end_bytes`` of audio and the transcript of every chunk whose audio began before it."""
    if end_bytes >= audio_bytes(content):
        return
    heard, start = 0, 0
    for audio_end, text_len in content.marks:
        if start < end_bytes or audio_end == start == 0:
            heard = text_len
        start = audio_end
    content.transcript = (content.transcript or "")[:heard]
    if content.audio is not None:
        content.audio = content.audio[:end_bytes]
    content.marks = [(min(a, end_bytes), min(t, heard)) for a, t in content.marks]


@dataclass(slots=True)
class Item:
    id: str
    type: str  # message | function_call | function_call_output | image_generation_call
    role: str | None = None
    status: str = "completed"
    content: list[Content] = field(default_factory=list)
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""
    output: str | None = None
    result: str | None = None  # image_generation_call: the base64 PNG, once completed

    def render(self, dialect: Dialect, audio_format: str | None = None) -> dict[str, Any]:
        """``audio_format`` set: include stored audio bytes (item retrieve); otherwise never."""
        out: dict[str, Any] = {"id": self.id, "type": self.type, "object": "realtime.item", "status": self.status}
        if self.type == "message":
            out["role"] = self.role
            out["content"] = [c.render(dialect, audio_format) for c in self.content]
        elif self.type == "function_call":
            out.update(call_id=self.call_id, name=self.name, arguments=self.arguments)
        elif self.type == "image_generation_call":
            if self.result is not None:
                out["result"] = self.result
        else:
            out.update(call_id=self.call_id, output=self.output)
        return out


# ---- client items -------------------------------------------------------------------------------
def parse_client_item(raw: Any, item_id: str, input_format: str, param: str = "item", *, max_image_bytes: int) -> Item:
    """A client-sent item (conversation.item.create / response.input) -> canonical Item."""
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    kind = raw.get("type", "message")
    if "id" in raw and raw["id"] is not None:
        if not isinstance(raw["id"], str) or not raw["id"] or len(raw["id"]) > 64:
            raise invalid_value(f"{param}.id", "a non-empty string of at most 64 characters", raw["id"])
        item_id = raw["id"]
    if kind == "function_call":
        for key in ("call_id", "name"):
            if not isinstance(raw.get(key), str):
                raise missing(f"{param}.{key}")
        arguments = raw.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            raise invalid_type(f"{param}.arguments", "a string of JSON", arguments)
        return Item(item_id, kind, call_id=raw["call_id"], name=raw["name"], arguments=arguments or "")
    if kind == "function_call_output":
        if not isinstance(raw.get("call_id"), str):
            raise missing(f"{param}.call_id")
        if not isinstance(raw.get("output"), str):
            raise invalid_type(f"{param}.output", "a string", raw.get("output"))
        return Item(item_id, kind, call_id=raw["call_id"], output=raw["output"])
    if kind != "message":
        raise invalid_value(f"{param}.type", "'message', 'function_call' or 'function_call_output'", kind)
    role = raw.get("role")
    if not isinstance(role, str) or role not in _ROLE_CONTENT:
        raise invalid_value(f"{param}.role", "'user', 'assistant' or 'system'", role)
    content = raw.get("content")
    if not isinstance(content, list):
        raise invalid_type(f"{param}.content", "an array of content parts", content)
    parts = [
        _parse_content(part, role, input_format, f"{param}.content[{i}]", max_image_bytes)
        for i, part in enumerate(content)
    ]
    return Item(item_id, "message", role=role, content=parts)


def _parse_content(raw: Any, role: str, input_format: str, param: str, max_image_bytes: int) -> Content:
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    kind = raw.get("type")
    if kind in ("text", "audio"):  # beta names
        kind = f"output_{kind}"
    if role == "assistant" and kind == "input_text":
        kind = "output_text"  # older clients replay assistant text as input_text
    if kind not in _ROLE_CONTENT[role]:
        raise invalid_value(f"{param}.type", " or ".join(repr(k) for k in _ROLE_CONTENT[role]), raw.get("type"))
    if kind in ("input_text", "output_text"):
        text = raw.get("text")
        if not isinstance(text, str):
            raise invalid_type(f"{param}.text", "a string", text)
        return Content(kind, text=text)
    if kind == "input_image":
        if "image_url" not in raw:
            raise missing(f"{param}.image_url")
        detail = raw.get("detail", "auto")
        if detail not in DETAILS:
            raise invalid_value(f"{param}.detail", "'auto', 'low' or 'high'", detail)
        data, mime = parse_image_url(raw["image_url"], f"{param}.image_url", max_image_bytes)
        return Content(kind, image=data, mime=mime, detail=detail)
    transcript = raw.get("transcript")
    if transcript is not None and not isinstance(transcript, str):
        raise invalid_type(f"{param}.transcript", "a string or null", transcript)
    pcm = None
    if raw.get("audio") is not None:
        pcm = audio_fmt.decode(decode_base64(raw["audio"], f"{param}.audio"), cast(audio_fmt.AudioFormat, input_format))
    return Content(kind, transcript=transcript, audio=pcm)


def decode_base64(value: Any, param: str) -> bytes:
    if not isinstance(value, str):
        raise invalid_type(param, "a base64 string", value)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_value(param, "valid base64", value[:32] + ("..." if len(value) > 32 else "")) from None


# ---- the ordered store --------------------------------------------------------------------------
class ItemStore:
    """The default conversation: items in order, addressable by id."""

    def __init__(self) -> None:
        self._items: list[Item] = []

    def __iter__(self) -> Iterator[Item]:
        return iter(list(self._items))  # a snapshot: callers may insert or delete while iterating

    def __len__(self) -> int:
        return len(self._items)

    def get(self, item_id: str) -> Item | None:
        return next((it for it in self._items if it.id == item_id), None)

    def last_id(self) -> str | None:
        return self._items[-1].id if self._items else None

    def insert(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after ``previous_item_id`` ("root": at the start; None: at the end); returns the id before it."""
        if self.get(item.id) is not None:
            raise RealtimeError("item_id_already_exists", f"Item with id '{item.id}' already exists.", "item.id")
        if previous_item_id is None:
            previous = self.last_id()
            self._items.append(item)
            return previous
        if previous_item_id == "root":
            self._items.insert(0, item)
            return None
        index = next((i for i, it in enumerate(self._items) if it.id == previous_item_id), None)
        if index is None:
            raise RealtimeError(
                "invalid_value",
                f"Item with id {shown(previous_item_id)} not found: "
                "previous_item_id must name an item in the conversation or be 'root'.",
                "previous_item_id",
            )
        self._items.insert(index + 1, item)
        return previous_item_id

    def drop_oldest_media(self, kind: Literal["audio", "image"], budget: int) -> None:
        """Drop the audio or image bytes of the oldest parts past ``budget`` bytes in all. The items and
        their parts stay: audio keeps its transcript and length, an image part renders without its URL."""
        parts = [c for it in self._items for c in it.content if getattr(c, kind)]
        total = sum(len(getattr(c, kind)) for c in parts)
        for content in parts:
            if total <= budget:
                break
            total -= len(getattr(content, kind))
            setattr(content, kind, None)

    def delete(self, item_id: str) -> bool:
        item = self.get(item_id)
        if item is None:
            return False
        self._items.remove(item)
        return True
