"""What a response is generated from: its context items, metadata, and the ``OmniRequest`` built of them."""
from __future__ import annotations

import base64
import re

from collections.abc import Callable
from typing import Any

from gateway.realtime.audio import SAMPLE_RATE
from gateway.realtime.errors import invalid_type, invalid_value
from gateway.realtime.items import Item, ItemStore, parse_client_item
from gateway.realtime.settings import SessionSettings
from omni.protocol import (AudioOutputOptions, AudioPart, ImagePart, Message, OmniRequest, Part, SamplingOptions,
                           TextPart, ToolCall)

_DATA_URI = re.compile(r"^data:(image/[\w.+-]+);base64,(.*)$", re.DOTALL)


def item_to_message(item: Item) -> Message | None:
    if item.type == "function_call":
        return Message("assistant", tool_calls=(ToolCall(item.call_id or "", item.name or "", item.arguments),))
    if item.type == "function_call_output":
        return Message("tool", parts=(TextPart(item.output or ""),), tool_call_id=item.call_id)
    parts: list[Part] = []
    for content in item.content:
        if content.type in ("input_text", "output_text"):
            parts.append(TextPart(content.text or ""))
        elif content.type == "input_audio":
            if content.audio:
                parts.append(AudioPart(content.audio, SAMPLE_RATE, transcript=content.transcript))
            elif content.transcript:  # audio dropped under the session's audio budget
                parts.append(TextPart(content.transcript))
        elif content.type == "output_audio":
            # What the assistant said is context as text; its own audio is never fed back.
            parts.append(TextPart(content.transcript or ""))
        elif content.type == "input_image" and content.image_url:
            match = _DATA_URI.match(content.image_url)
            if match:
                parts.append(ImagePart(base64.b64decode(match.group(2)), mime=match.group(1),
                                       detail=content.detail or "auto"))
    if not parts:
        return None
    return Message(item.role or "user", parts=tuple(parts))  # type: ignore[arg-type]


def build_request(request_id: str, settings: SessionSettings, items: list[Item]) -> OmniRequest:
    messages: list[Message] = []
    if settings.instructions:
        messages.append(Message("system", parts=(TextPart(settings.instructions),)))
    messages += [m for m in (item_to_message(it) for it in items) if m is not None]
    max_tokens = None if settings.max_output_tokens == "inf" else settings.max_output_tokens
    tools = settings.tools if settings.tool_choice != "none" else ()
    return OmniRequest(
        request_id=request_id,
        messages=tuple(messages),
        modalities=("text", "audio") if settings.wants_audio else ("text",),
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=settings.temperature),
        audio=AudioOutputOptions(voice=settings.voice, sample_rate=SAMPLE_RATE, speed=settings.speed),
        tools=tuple(tools),
        priority=0,
    )


def parse_metadata(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > 16 or any(
            not isinstance(k, str) or not isinstance(v, str) or len(k) > 64 or len(v) > 512 for k, v in raw.items()):
        raise invalid_value("response.metadata", "at most 16 string pairs (keys <= 64, values <= 512 chars)", raw)
    return raw


def resolve_input(raw_input: Any, items: ItemStore, new_item_id: Callable[[], str], input_format: str) -> list[Item]:
    """``response.input``: absent -> the whole conversation; else its own items and references into it."""
    if raw_input is None:
        return list(items)
    if not isinstance(raw_input, list):
        raise invalid_type("response.input", "an array of items", raw_input)
    context: list[Item] = []
    for i, raw in enumerate(raw_input):
        if isinstance(raw, dict) and raw.get("type") == "item_reference":
            ref = items.get(raw["id"]) if isinstance(raw.get("id"), str) else None
            if ref is None:
                raise invalid_value(f"response.input[{i}].id", "the id of an item in the conversation", raw.get("id"))
            context.append(ref)
        else:
            context.append(parse_client_item(raw, new_item_id(), input_format, f"response.input[{i}]"))
    return context
