"""Conversation items + effective settings -> the ``OmniRequest`` the backend generates from."""
from __future__ import annotations

import base64
import re

from gateway.realtime.audio import SAMPLE_RATE
from gateway.realtime.items import Item
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
            parts.append(AudioPart(content.audio or b"", SAMPLE_RATE, transcript=content.transcript))
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
