"""One response's lifecycle, in the order real clients rely on: ``response.created``; then per output item
``response.output_item.added``, ``conversation.item.added``, for each content part ``response.content_part.added``,
its deltas and their ``.done``, ``response.content_part.done`` (a tool call has arguments deltas, no parts),
``response.output_item.done``, ``conversation.item.done``; last ``response.done``.

Events are built with GA names; the session renames them for beta clients. Items are opened lazily on
the first chunk of their kind, so a response that only calls a tool has no empty message item.

Generated images (an extension) follow OpenAI's Responses API: an ``image_generation_call`` output item,
``response.image_generation_call.partial_image`` events for its previews, and the final base64 PNG as
the item's ``result`` in ``response.output_item.done``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.frames import Base64
from omni_gateway.gateway.realtime.image_output import render_size
from omni_gateway.gateway.realtime.items import Content, Item, ItemStore
from omni_gateway.gateway.realtime.settings import Dialect, SessionSettings, render_ga_format
from omni_gateway.omni.protocol import (
    AudioChunk,
    ImageFinal,
    ImageOutputOptions,
    ImagePartial,
    ToolCallArguments,
    ToolCallDelta,
    Usage,
)

Event = dict[str, Any]


def render_usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    input_text = max(0, usage.input_tokens - usage.input_audio_tokens - usage.input_image_tokens)
    output_text = max(0, usage.output_tokens - usage.output_audio_tokens)
    return {
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "input_token_details": {
            "text_tokens": input_text,
            "audio_tokens": usage.input_audio_tokens,
            "image_tokens": usage.input_image_tokens,
            "cached_tokens": usage.cached_tokens,
            "cached_tokens_details": {"text_tokens": usage.cached_tokens, "audio_tokens": 0, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": output_text, "audio_tokens": usage.output_audio_tokens},
    }


class ResponseRun:
    """Builds the server events of one response. ``store`` is None for out-of-band responses."""

    def __init__(
        self,
        response_id: str,
        settings: SessionSettings,
        dialect: Dialect,
        *,
        store: ItemStore | None,
        conversation_id: str | None,
        metadata: dict[str, str] | None,
        context: list[Item],
        new_item_id: Callable[[], str],
        image: ImageOutputOptions | None = None,
    ) -> None:
        self.id = response_id
        self.settings = settings
        self.dialect = dialect
        self.store = store
        self.conversation_id = conversation_id
        self.metadata = metadata
        self.context = context
        self.status = "in_progress"
        self.status_details: dict[str, Any] | None = None
        self.output: list[Item] = []
        self.usage: Usage | None = None
        self.audio_emitted = False
        self.finish_reason = "stop"
        self._new_item_id = new_item_id
        self._message: Item | None = None
        self.image = image or ImageOutputOptions()
        self._images: dict[int, Item] = {}  # image_index -> its open image_generation_call item
        self._images_done: set[int] = set()
        self._calls: dict[str, Item] = {}  # call_id -> its function_call item while its arguments stream

    @property
    def active(self) -> bool:
        return self.status == "in_progress"

    @property
    def wants_audio(self) -> bool:
        wants: bool = self.settings.wants_audio
        return wants

    def render(self) -> dict[str, Any]:
        s = self.settings
        out: dict[str, Any] = {
            "object": "realtime.response",
            "id": self.id,
            "status": self.status,
            "status_details": self.status_details,
            "output": [item.render(self.dialect) for item in self.output],
            "conversation_id": self.conversation_id,
            "usage": render_usage(self.usage),
            "metadata": self.metadata,
            "max_output_tokens": s.max_output_tokens,
        }
        if self.dialect == "beta":
            spoken = ["text", "audio"] if s.wants_audio else ["text"] if "text" in s.output_modalities else []
            out.update(
                modalities=spoken + (["image"] if s.wants_image else []),
                voice=s.voice,
                output_audio_format=s.output_format,
                temperature=s.temperature,
            )
        else:
            out.update(
                output_modalities=list(s.output_modalities),
                audio={"output": {"format": render_ga_format(s.output_format), "voice": s.voice}},
            )
        return out

    def created(self) -> list[Event]:
        return [{"type": "response.created", "response": self.render()}]

    # ---- items ------------------------------------------------------------------------------------
    def _open_item(self, item: Item) -> list[Event]:
        item.status = "in_progress"
        self.output.append(item)
        events: list[Event] = [
            {
                "type": "response.output_item.added",
                "response_id": self.id,
                "output_index": len(self.output) - 1,
                "item": item.render(self.dialect),
            }
        ]
        if self.store is not None:
            previous = self.store.insert(item)
            events.append(
                {"type": "conversation.item.added", "previous_item_id": previous, "item": item.render(self.dialect)}
            )
        return events

    def _close_item(self, item: Item, status: str) -> list[Event]:
        item.status = status
        events: list[Event] = [
            {
                "type": "response.output_item.done",
                "response_id": self.id,
                "output_index": self.output.index(item),
                "item": item.render(self.dialect),
            }
        ]
        if self.store is not None and self.store.get(item.id) is item:
            events.append({"type": "conversation.item.done", "item": item.render(self.dialect)})
        return events

    def _part_ref(self, item: Item) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": item.id, "output_index": self.output.index(item), "content_index": 0}

    def _ensure_message(self) -> list[Event]:
        if self._message is not None:
            return []
        kind = "output_audio" if self.wants_audio else "output_text"
        self._message = Item(self._new_item_id(), "message", role="assistant")
        events = self._open_item(self._message)
        content = Content(
            kind,
            text="" if kind == "output_text" else None,
            transcript="" if kind == "output_audio" else None,
            audio=b"" if self.wants_audio else None,
        )
        self._message.content.append(content)
        part = {"type": "audio", "transcript": ""} if self.wants_audio else {"type": "text", "text": ""}
        events.append({"type": "response.content_part.added", **self._part_ref(self._message), "part": part})
        return events

    def _close_message(self, status: str) -> list[Event]:
        message, self._message = self._message, None
        if message is None:
            return []
        ref = self._part_ref(message)
        content = message.content[0]
        if content.type == "output_audio":
            events: list[Event] = [
                {"type": "response.output_audio.done", **ref},
                {"type": "response.output_audio_transcript.done", **ref, "transcript": content.transcript},
                {
                    "type": "response.content_part.done",
                    **ref,
                    "part": {"type": "audio", "transcript": content.transcript},
                },
            ]
        else:
            events = [
                {"type": "response.output_text.done", **ref, "text": content.text},
                {"type": "response.content_part.done", **ref, "part": {"type": "text", "text": content.text}},
            ]
        return events + self._close_item(message, status)

    # ---- chunks -----------------------------------------------------------------------------------
    def on_text(self, text: str) -> list[Event]:
        if not text or self.wants_audio:  # audio responses take their transcript from the audio chunks
            return []
        events = self._ensure_message()
        assert self._message is not None
        content = self._message.content[0]
        content.text = (content.text or "") + text
        return events + [{"type": "response.output_text.delta", **self._part_ref(self._message), "delta": text}]

    def on_audio(self, chunk: AudioChunk) -> list[Event]:
        if not self.wants_audio:
            return self.on_text(chunk.transcript)
        events = self._ensure_message()
        assert self._message is not None
        ref = self._part_ref(self._message)
        content = self._message.content[0]
        if chunk.transcript:
            content.transcript = (content.transcript or "") + chunk.transcript
            events.append({"type": "response.output_audio_transcript.delta", **ref, "delta": chunk.transcript})
        end = content.marks[-1][0] if content.marks else 0
        if chunk.pcm16:
            pcm24 = audio_fmt.encode(chunk.pcm16, "pcm16", chunk.sample_rate)
            end += len(pcm24)
            if not isinstance(content.audio, bytearray):
                content.audio = bytearray(content.audio or b"")  # grows in place: long replies stay linear
            content.audio += pcm24
            fmt = self.settings.output_format
            wire = pcm24 if fmt == "pcm16" else audio_fmt.encode(pcm24, fmt)
            events.append({"type": "response.output_audio.delta", **ref, "delta": Base64.of(wire)})
            self.audio_emitted = True
        content.marks.append((end, len(content.transcript or "")))
        return events

    def on_tool_arguments(self, chunk: ToolCallArguments) -> list[Event]:
        """A piece of a call's arguments: the first opens its function_call item."""
        item = self._calls.get(chunk.call_id)
        events: list[Event] = []
        if item is None:
            events += self._close_message("completed")
            item = Item(self._new_item_id(), "function_call", call_id=chunk.call_id, name=chunk.name)
            self._calls[chunk.call_id] = item
            events += self._open_item(item)
        if chunk.delta:
            item.arguments += chunk.delta
            events.append(
                {"type": "response.function_call_arguments.delta", **self._call_ref(item), "delta": chunk.delta}
            )
        return events

    def on_tool_call(self, call: ToolCallDelta) -> list[Event]:
        """A complete call: closes the item its pieces opened, or opens and closes one at once."""
        item = self._calls.pop(call.call_id, None)
        events: list[Event] = []
        if item is None:
            events += self._close_message("completed")
            item = Item(self._new_item_id(), "function_call", call_id=call.call_id, name=call.name)
            events += self._open_item(item)
            events.append(
                {"type": "response.function_call_arguments.delta", **self._call_ref(item), "delta": call.arguments}
            )
        item.arguments = call.arguments
        events.append(
            {
                "type": "response.function_call_arguments.done",
                **self._call_ref(item),
                "name": call.name,
                "arguments": call.arguments,
            }
        )
        return events + self._close_item(item, "completed")

    def _call_ref(self, item: Item) -> dict[str, Any]:
        return {
            "response_id": self.id,
            "item_id": item.id,
            "output_index": self.output.index(item),
            "call_id": item.call_id,
        }

    def _open_image(self, image_index: int) -> list[Event]:
        if image_index in self._images:
            return []
        item = Item(self._new_item_id(), "image_generation_call")
        self._images[image_index] = item
        return self._open_item(item)

    def on_image_partial(self, chunk: ImagePartial) -> list[Event]:
        if chunk.image_index in self._images_done:
            return []
        events = self._open_image(chunk.image_index)
        item = self._images[chunk.image_index]
        events.append(
            {
                "type": "response.image_generation_call.partial_image",
                "response_id": self.id,
                "item_id": item.id,
                "output_index": self.output.index(item),
                "partial_image_index": chunk.index,
                "partial_image_b64": base64.b64encode(chunk.png).decode(),
                "size": render_size(self.image),
            }
        )
        return events

    def on_image_final(self, chunk: ImageFinal) -> list[Event]:
        if chunk.image_index in self._images_done:
            return []
        events = self._open_image(chunk.image_index)
        item = self._images.pop(chunk.image_index)
        self._images_done.add(chunk.image_index)
        item.result = base64.b64encode(chunk.png).decode()
        return events + self._close_item(item, "completed")

    def finish(self, status: str, *, reason: str | None = None, error: dict[str, Any] | None = None) -> list[Event]:
        """Close whatever is open and emit response.done; later chunks are ignored by the session."""
        if not self.active:
            return []
        events = self._close_message("completed" if status == "completed" else "incomplete")
        for image_index in sorted(self._images):  # an image that never got its final one
            events += self._close_item(self._images.pop(image_index), "incomplete")
        for call_id in list(self._calls):  # a call cut off before its arguments were complete
            events += self._close_item(self._calls.pop(call_id), "incomplete")
        self.status = status
        if status != "completed":
            self.status_details = {"type": status, "reason": reason, "error": error}
        return events + [{"type": "response.done", "response": self.render()}]
