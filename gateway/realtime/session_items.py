"""The ``conversation.item.*`` client events of a ``RealtimeSession``: create, retrieve, delete, truncate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import SessionLimits
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_type, invalid_value, missing
from omni_gateway.gateway.realtime.items import Item, ItemStore, audio_bytes, parse_client_item, truncate
from omni_gateway.gateway.realtime.response import Event, ResponseRun
from omni_gateway.gateway.realtime.settings import Dialect, SessionSettings


class ConversationItems:
    """Part of ``RealtimeSession``, which holds the state named below."""

    items: ItemStore
    limits: SessionLimits
    settings: SessionSettings
    dialect: Dialect
    _active: str | None
    _responses: dict[str, ResponseRun]

    if TYPE_CHECKING:

        def _emit(self, event: Event) -> None: ...
        def _new_item_id(self) -> str: ...
        def _cancel(self, response_id: str, reason: str) -> None: ...

    def _insert(self, item: Item, previous_item_id: str | None) -> str | None:
        if len(self.items) >= self.limits.max_items:
            raise RealtimeError(
                "conversation_too_long",
                f"The conversation already holds {self.limits.max_items} items; delete some before adding more.",
            )
        return self.items.insert(item, previous_item_id)

    def _announce(self, item: Item, previous: str | None) -> None:
        self._emit({"type": "conversation.item.added", "previous_item_id": previous, "item": item.render(self.dialect)})
        self._emit({"type": "conversation.item.done", "previous_item_id": previous, "item": item.render(self.dialect)})

    def _item_create(self, event: dict[str, Any]) -> None:
        if "item" not in event:
            raise missing("item")
        previous_id = event.get("previous_item_id")
        if previous_id is not None and not isinstance(previous_id, str):
            raise invalid_type("previous_item_id", "a string", previous_id)
        item = parse_client_item(
            event["item"], self._new_item_id(), self.settings.input_format, max_image_bytes=self.limits.max_image_bytes
        )
        if item.type == "function_call_output" and not any(
            it.type == "function_call" and it.call_id == item.call_id for it in self.items
        ):
            raise RealtimeError(
                "invalid_tool_call_id", f"Tool call ID '{item.call_id}' not found in conversation.", "item.call_id"
            )
        previous = self._insert(item, previous_id)
        self._announce(item, previous)
        self.items.drop_oldest_media("image", self.limits.max_conversation_image_bytes)

    def _lookup(self, event: dict[str, Any], code: str) -> Item:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            raise missing("item_id")
        item = self.items.get(item_id)
        if item is None:
            raise RealtimeError(code, f"Item with item_id {shown(item_id)} not found.", "item_id")
        return item

    def _item_retrieve(self, event: dict[str, Any]) -> None:
        item = self._lookup(event, "item_retrieve_invalid_item_id")
        audio_format = self.settings.output_format if item.role == "assistant" else self.settings.input_format
        self._emit({"type": "conversation.item.retrieved", "item": item.render(self.dialect, audio_format)})

    def _item_delete(self, event: dict[str, Any]) -> None:
        item = self._lookup(event, "item_delete_invalid_item_id")
        self.items.delete(item.id)
        self._emit({"type": "conversation.item.deleted", "item_id": item.id})

    def _item_truncate(self, event: dict[str, Any]) -> None:
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
        if self._active is not None and any(it is item for it in self._responses[self._active].output):
            self._cancel(self._active, "client_cancelled")
        truncate(content, end_ms * audio_fmt.BYTES_PER_MS)
        self._emit(
            {"type": "conversation.item.truncated", "item_id": item.id, "content_index": index, "audio_end_ms": end_ms}
        )
