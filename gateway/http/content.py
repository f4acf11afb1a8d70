"""Chat messages in OpenAI's JSON shape -> ``omni.protocol.Message``s, media decoded and bounded.

Pure: no I/O. Images travel as data URIs only, since this server does not fetch URLs.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import cast

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.http.fields import get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.wav import decode_wav
from omni_gateway.omni.protocol import AudioPart, Capabilities, ImagePart, Message, Part, Role, TextPart, ToolCall

IMAGE_MIMES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif")
AUDIO_FORMATS = ("wav", "mp3")
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass
class _MediaBudget:
    left: int


def parse_messages(value: object, caps: Capabilities, limits: HttpLimits) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty array of message objects.", "messages")
    if len(value) > limits.max_messages:
        raise invalid(
            f"'messages' has {len(value)} entries; at most {limits.max_messages} are accepted.",
            "messages",
            "array_above_max_length",
        )
    budget = _MediaBudget(limits.max_media_parts)
    return tuple(_message(m, f"messages[{i}]", caps, limits, budget) for i, m in enumerate(value))


def _message(value: object, param: str, caps: Capabilities, limits: HttpLimits, budget: _MediaBudget) -> Message:
    body = require_object(value, param)
    role_name = get_str(body, "role", required=True, param=f"{param}.role")
    role = _ROLES.get(role_name)
    if role is None:
        raise invalid(f"'{param}.role' must be one of {', '.join(_ROLES)}, got {shown(role_name)}.", f"{param}.role")
    parts = _content(body.get("content"), f"{param}.content", role, caps, limits, budget)
    tool_calls = _tool_calls(body.get("tool_calls"), f"{param}.tool_calls") if role == "assistant" else ()
    tool_call_id = None
    if role == "tool":
        tool_call_id = get_str(body, "tool_call_id", required=True, param=f"{param}.tool_call_id")
    if not parts and not tool_calls and role != "assistant":
        raise invalid(f"'{param}.content' must not be empty for a {role_name} message.", f"{param}.content")
    return Message(role=cast(Role, role), parts=parts, tool_calls=tool_calls, tool_call_id=tool_call_id)


def _content(
    value: object, param: str, role: str, caps: Capabilities, limits: HttpLimits, budget: _MediaBudget
) -> tuple[Part, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (TextPart(value),) if value else ()
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be a string or an array of content parts.", param)
    parts: list[Part] = []
    for i, item in enumerate(value):
        p = f"{param}[{i}]"
        part = require_object(item, p)
        kind = get_str(part, "type", required=True, param=f"{p}.type")
        if kind in ("text", "refusal"):
            parts.append(TextPart(get_str(part, kind, required=True, param=f"{p}.{kind}")))
            continue
        if role != "user":
            raise invalid(f"'{p}': {role} messages take text parts only, got {shown(kind)}.", f"{p}.type")
        if kind == "image_url":
            parts.append(_image(part.get("image_url"), f"{p}.image_url", caps, limits))
        elif kind == "input_audio":
            parts.append(_audio(part.get("input_audio"), f"{p}.input_audio", caps, limits))
        else:
            raise invalid(f"'{p}.type' must be 'text', 'image_url' or 'input_audio', got {shown(kind)}.", f"{p}.type")
        budget.left -= 1
        if budget.left < 0:
            raise invalid(
                f"at most {limits.max_media_parts} images and audio clips are accepted per request.",
                p,
                "too_many_media_parts",
            )
    return tuple(parts)


def _image(value: object, param: str, caps: Capabilities, limits: HttpLimits) -> ImagePart:
    if "image" not in caps.input_modalities:
        raise invalid(f"model '{caps.model}' does not accept image input.", param, "unsupported_modality")
    if isinstance(value, str):  # a bare URL string is tolerated, as several clients send it
        value = {"url": value}
    body = require_object(value, param)
    url = get_str(body, "url", required=True, param=f"{param}.url")
    detail = get_str(body, "detail", "auto", choices=("auto", "low", "high"), param=f"{param}.detail")
    if not url.startswith("data:"):
        raise invalid(
            f"'{param}.url' must be a base64 data URI (data:image/png;base64,...); this server does "
            "not fetch images from URLs.",
            f"{param}.url",
            "invalid_image_url",
        )
    header, sep, payload = url[5:].partition(",")
    mime, _, encoding = header.partition(";")
    if not sep or encoding != "base64":
        raise invalid(
            f"'{param}.url' must be a base64 data URI of the form data:<mime>;base64,<data>.",
            f"{param}.url",
            "invalid_image_url",
        )
    mime = mime.lower()
    if mime not in IMAGE_MIMES:
        raise invalid(
            f"'{param}.url' has media type {shown(mime)}; accepted: {', '.join(IMAGE_MIMES)}.",
            f"{param}.url",
            "invalid_image_format",
        )
    data = b64decode(payload, f"{param}.url", limits.max_media_bytes)
    return ImagePart(data=data, mime="image/jpeg" if mime == "image/jpg" else mime, detail=detail)


def _audio(value: object, param: str, caps: Capabilities, limits: HttpLimits) -> AudioPart:
    if "audio" not in caps.input_modalities:
        raise invalid(f"model '{caps.model}' does not accept audio input.", param, "unsupported_modality")
    body = require_object(value, param)
    fmt = get_str(body, "format", required=True, choices=AUDIO_FORMATS, param=f"{param}.format")
    data = b64decode(
        get_str(body, "data", required=True, param=f"{param}.data"), f"{param}.data", limits.max_media_bytes
    )
    if fmt == "wav":
        pcm16, rate = decode_wav(data, max_seconds=limits.max_audio_seconds, param=f"{param}.data")
        return AudioPart(pcm16=pcm16, sample_rate=rate)
    return AudioPart(pcm16=b"", sample_rate=0, encoded=data)


def b64decode(text: str, param: str, max_bytes: int) -> bytes:
    """Decode strict base64, refusing before decoding anything when the result would be over ``max_bytes``."""
    if len(text) // 4 * 3 > max_bytes + 2:
        raise ApiError(413, f"'{param}' decodes to more than {max_bytes} bytes.", param=param, code="media_too_large")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"'{param}' is not valid base64.", param, "invalid_base64") from None
    if not data:
        raise invalid(f"'{param}' is empty.", param)
    return data


def _tool_calls(value: object, param: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be an array.", param)
    calls = []
    for i, item in enumerate(value):
        p = f"{param}[{i}]"
        call = require_object(item, p)
        fn = require_object(call.get("function"), f"{p}.function")
        calls.append(
            ToolCall(
                call_id=get_str(call, "id", required=True, param=f"{p}.id"),
                name=get_str(fn, "name", required=True, param=f"{p}.function.name"),
                arguments=get_str(fn, "arguments", "{}", param=f"{p}.function.arguments"),
            )
        )
    return tuple(calls)
