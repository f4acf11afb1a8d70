"""The ``conversation.item.*`` client events of a ``RealtimeSession`` (create, retrieve, delete, truncate) and
how any part adds an item to the conversation. Uses the core and the responses (truncating what the active
response is writing cancels it)."""

from __future__ import annotations

from typing import Any

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_type, invalid_value, missing
from omni_gateway.gateway.realtime.items import Item, audio_bytes, parse_client_item, truncate
from omni_gateway.gateway.realtime.session_core import SessionCore
from omni_gateway.gateway.realtime.session_responses import Responses


class ConversationItems:
    """The conversation's items as the client and the input turns change them."""

    def __init__(self, core: SessionCore, responses: Responses) -> None:
        self._core = core
        self._responses = responses

    def insert(self, item: Item, previous_item_id: str | None) -> str | None:
        """Add ``item`` after ``previous_item_id`` ("root": first; None: last) unless the conversation is full;
        returns the id of the item before it."""
        if len(self._core.items) >= self._core.limits.max_items:
            raise RealtimeError(
                "conversation_too_long",
                f"The conversation already holds {self._core.limits.max_items} items; delete some before adding more.",
            )
        return self._core.items.insert(item, previous_item_id)

    def announce(self, item: Item, previous: str | None) -> None:
        """Tell the client ``item`` joined the conversation after ``previous``."""
        core = self._core
        core.emit({"type": "conversation.item.added", "previous_item_id": previous, "item": item.render(core.dialect)})
        core.emit({"type": "conversation.item.done", "previous_item_id": previous, "item": item.render(core.dialect)})

    def item_create(self, event: dict[str, Any]) -> None:
        core = self._core
        if "item" not in event:
            raise missing("item")
        previous_id = event.get("previous_item_id")
        if previous_id is not None and not isinstance(previous_id, str):
            raise invalid_type("previous_item_id", "a string", previous_id)
        item = parse_client_item(
            event["item"],
            core.new_item_id(),
            core.settings.input_format,
            max_image_bytes=core.limits.max_image_bytes,
        )
        if item.type == "function_call_output" and not any(
            it.type == "function_call" and it.call_id == item.call_id for it in core.items
        ):
            raise RealtimeError(
                "invalid_tool_call_id", f"Tool call ID '{item.call_id}' not found in conversation.", "item.call_id"
            )
        previous = self.insert(item, previous_id)
        self.announce(item, previous)
        core.items.drop_oldest_media("image", core.limits.max_conversation_image_bytes)

    def _lookup(self, event: dict[str, Any], code: str) -> Item:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            raise missing("item_id")
        item = self._core.items.get(item_id)
        if item is None:
            raise RealtimeError(code, f"Item with item_id {shown(item_id)} not found.", "item_id")
        return item

    def item_retrieve(self, event: dict[str, Any]) -> None:
        core = self._core
        item = self._lookup(event, "item_retrieve_invalid_item_id")
        audio_format = core.settings.output_format if item.role == "assistant" else core.settings.input_format
        core.emit({"type": "conversation.item.retrieved", "item": item.render(core.dialect, audio_format)})

    def item_delete(self, event: dict[str, Any]) -> None:
        item = self._lookup(event, "item_delete_invalid_item_id")
        self._core.items.delete(item.id)
        self._core.emit({"type": "conversation.item.deleted", "item_id": item.id})

    def item_truncate(self, event: dict[str, Any]) -> None:
        item = self._lookup(event, "item_truncate_invalid_item_id")
        index = event.get("content_index", 0)
        end_ms = event.get("audio_end_ms")
        if not isinstance(index, int) or isinstance(index, bool):
            raise invalid_type("content_index", "an integer", index)
        if "audio_end_ms" not in event:
            raise missing("audio_end_ms")
        if not isinstance(end_ms, int) or isinstance(end_ms, bool):
            raise invalid_type("audio_end_ms", "an integer", end_ms)
        if end_ms < 0:
            raise invalid_value("audio_end_ms", "a non-negative integer", end_ms)
        if item.role != "assistant" or not 0 <= index < len(item.content) or item.content[index].type != "output_audio":
            raise invalid_value("content_index", "the index of an assistant audio content part", index)
        content = item.content[index]
        length_ms = int(audio_fmt.duration_ms(audio_bytes(content)))
        if end_ms > length_ms:
            raise RealtimeError(
                "invalid_value", f"Audio content of {length_ms}ms is already shorter than {end_ms}ms", "audio_end_ms"
            )
        writer = self._responses.writer_of(item)
        if writer is not None:
            self._responses.cancel(writer, "client_cancelled")
        truncate(content, end_ms * audio_fmt.BYTES_PER_MS)
        self._core.emit(
            {"type": "conversation.item.truncated", "item_id": item.id, "content_index": index, "audio_end_ms": end_ms}
        )
