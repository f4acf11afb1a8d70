"""What a response is generated from: its context items, metadata, and the ``OmniRequest`` built of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from omni_gateway.gateway.realtime.audio import SAMPLE_RATE
from omni_gateway.gateway.realtime.errors import invalid_type, invalid_value
from omni_gateway.gateway.realtime.items import Item, ItemStore, parse_client_item
from omni_gateway.gateway.realtime.settings import SessionSettings
from omni_gateway.omni.protocol import (
    AudioOutputOptions,
    AudioPart,
    ImageOutputOptions,
    ImagePart,
    Message,
    Modality,
    OmniRequest,
    Part,
    Role,
    SamplingOptions,
    TextPart,
    ToolCall,
    ToolChoice,
)


def item_to_message(item: Item) -> Message | None:
    if item.type == "image_generation_call":
        return None  # a generated image is output only; the model never reads it back
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
        elif content.type == "input_image" and content.image is not None:
            parts.append(ImagePart(content.image, mime=content.mime, detail=content.detail or "auto"))
    if not parts:
        return None
    return Message(cast(Role, item.role or "user"), parts=tuple(parts))  # roles were checked when the item was parsed


def is_frame(item: Item) -> bool:
    """A user message of images only: what a client streaming a camera sends once a second."""
    return (
        item.type == "message"
        and item.role == "user"
        and bool(item.content)
        and all(c.type == "input_image" for c in item.content)
    )


def has_images(items: list[Item]) -> bool:
    return any(c.type == "input_image" and c.image is not None for it in items for c in it.content)


def recent_frames_only(items: list[Item], keep: int) -> list[Item]:
    """The context without all but the ``keep`` most recent image-only user items, so a camera stream
    does not grow the prompt without bound; the dropped frames stay in the conversation."""
    frames = [it for it in items if is_frame(it)]
    stale = {id(it) for it in frames[: max(0, len(frames) - keep)]}
    return [it for it in items if id(it) not in stale]


def request_modalities(settings: SessionSettings) -> tuple[Modality, ...]:
    spoken: tuple[Modality, ...] = (
        ("text", "audio") if settings.wants_audio else ("text",) if "text" in settings.output_modalities else ()
    )
    return spoken + (("image",) if settings.wants_image else ())


def build_request(
    request_id: str,
    settings: SessionSettings,
    items: list[Item],
    *,
    max_image_frames: int,
    image: ImageOutputOptions | None = None,
) -> OmniRequest:
    messages: list[Message] = []
    if settings.instructions:
        messages.append(Message("system", parts=(TextPart(settings.instructions),)))
    context = recent_frames_only(items, max_image_frames)
    messages += [m for m in (item_to_message(it) for it in context) if m is not None]
    max_tokens = None if settings.max_output_tokens == "inf" else settings.max_output_tokens
    tools, tool_choice = _offered_tools(settings)
    return OmniRequest(
        request_id=request_id,
        messages=tuple(messages),
        modalities=request_modalities(settings),
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=settings.temperature),
        audio=AudioOutputOptions(voice=settings.voice, sample_rate=SAMPLE_RATE, speed=settings.speed),
        image=image or ImageOutputOptions(),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=False,  # the realtime API takes parallel_tool_calls false only: one call a response
        priority=0,
        model=settings.model,
    )


def _offered_tools(settings: SessionSettings) -> tuple[tuple[dict[str, Any], ...], ToolChoice]:
    """The tools a response may call and whether it must: "none" offers none; a named function offers
    that one tool and requires its call."""
    choice = settings.tool_choice
    if choice == "none" or not settings.tools:
        return (), "auto"
    if choice == "required":
        return tuple(settings.tools), "required"
    if isinstance(choice, dict):
        return tuple(t for t in settings.tools if t.get("name") == choice.get("name")), "required"
    return tuple(settings.tools), "auto"


def parse_metadata(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, dict)
        or len(raw) > 16
        or any(not isinstance(k, str) or not isinstance(v, str) or len(k) > 64 or len(v) > 512 for k, v in raw.items())
    ):
        raise invalid_value("response.metadata", "at most 16 string pairs (keys <= 64, values <= 512 chars)", raw)
    return raw


def resolve_input(
    raw_input: Any, items: ItemStore, new_item_id: Callable[[], str], input_format: str, *, max_image_bytes: int
) -> list[Item]:
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
            context.append(
                parse_client_item(
                    raw, new_item_id(), input_format, f"response.input[{i}]", max_image_bytes=max_image_bytes
                )
            )
    return context
