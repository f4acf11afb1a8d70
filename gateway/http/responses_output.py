"""Backend output chunks -> a Responses API ``response`` object and its streamed events. Pure.

Output items open in the order the model starts them: text opens a ``message`` item, a tool call closes
any open message and opens a ``function_call`` item. A call whose complete arguments never arrived (cut
by ``max_output_tokens``) ends ``incomplete`` and gets no ``function_call_arguments.done``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from omni_gateway.gateway.http.errors import from_backend
from omni_gateway.gateway.http.responses_request import ResponsesCall
from omni_gateway.omni.protocol import Done, Error, OutputChunk, TextDelta, ToolCallArguments, ToolCallDelta, Usage


@dataclass
class _Item:
    body: dict[str, Any]
    text: list[str] = field(default_factory=list)
    complete: bool = False  # function calls: the whole arguments arrived


class ResponseAssembler:
    """Folds one response's chunk stream; ``start``, ``feed`` and ``finish`` return the events to stream."""

    def __init__(self, call: ResponsesCall, created_at: int) -> None:
        self.call = call
        self.created_at = created_at
        self.items: list[_Item] = []
        self._message: int | None = None  # index of the open message item
        self._calls: dict[str, int] = {}  # call_id -> item index
        self._sequence = 0
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    # ---- events ---------------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.body("in_progress")
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: OutputChunk) -> list[dict[str, Any]]:
        """Record ``chunk``; an ``Error`` chunk raises the ``ApiError`` it maps to."""
        if isinstance(chunk, Error):
            raise from_backend(chunk)
        if isinstance(chunk, Usage):
            self.usage = chunk
            return []
        if isinstance(chunk, TextDelta):
            return self._text(chunk.text)
        if isinstance(chunk, ToolCallArguments):
            return self._call_piece(chunk.call_id, chunk.name, chunk.delta)
        if isinstance(chunk, ToolCallDelta):
            return self._call_complete(chunk.call_id, chunk.name, chunk.arguments)
        if isinstance(chunk, Done):
            self.finish_reason = chunk.finish_reason
        return []

    def finish(self) -> list[dict[str, Any]]:
        """Close every open item and end the response."""
        events = self._close_message()
        for index, item in enumerate(self.items):
            if item.body["type"] == "function_call" and item.body["status"] == "in_progress":
                item.body["status"] = "incomplete"  # its arguments were cut off
                events.append(self.event("response.output_item.done", output_index=index, item=dict(item.body)))
        body = self.body()
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return [*events, self.event(kind, response=body)]

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._message is None:
            item_id = f"msg_{uuid.uuid4().hex}"
            body = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            self.items.append(_Item(body))
            self._message = len(self.items) - 1
            events += [
                self.event("response.output_item.added", output_index=self._message, item=_copy(body)),
                self.event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=self._message,
                    content_index=0,
                    part=_text_part(""),
                ),
            ]
        item = self.items[self._message]
        item.text.append(text)
        if text:
            events.append(
                self.event(
                    "response.output_text.delta",
                    item_id=item.body["id"],
                    output_index=self._message,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return events

    def _close_message(self) -> list[dict[str, Any]]:
        if self._message is None:
            return []
        index, self._message = self._message, None
        item = self.items[index]
        text = "".join(item.text)
        item.body["content"] = [_text_part(text)]
        item.body["status"] = "incomplete" if self.finish_reason == "length" else "completed"
        where = {"item_id": item.body["id"], "output_index": index, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=_text_part(text)),
            self.event("response.output_item.done", output_index=index, item=_copy(item.body)),
        ]

    def _open_call(self, call_id: str, name: str) -> tuple[int, list[dict[str, Any]]]:
        if call_id in self._calls:
            return self._calls[call_id], []
        events = self._close_message()
        body = {
            "id": f"fc_{uuid.uuid4().hex}",
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        self.items.append(_Item(body))
        index = self._calls[call_id] = len(self.items) - 1
        return index, [*events, self.event("response.output_item.added", output_index=index, item=dict(body))]

    def _call_piece(self, call_id: str, name: str, delta: str) -> list[dict[str, Any]]:
        index, events = self._open_call(call_id, name)
        item = self.items[index]
        if delta and not item.complete:
            item.body["arguments"] += delta
            events.append(
                self.event(
                    "response.function_call_arguments.delta", item_id=item.body["id"], output_index=index, delta=delta
                )
            )
        return events

    def _call_complete(self, call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
        index, events = self._open_call(call_id, name)
        item = self.items[index]
        streamed = item.body["arguments"]
        if not streamed:  # the call arrived whole: its arguments go out as one delta
            events += self._call_piece(call_id, name, arguments)
        item.body["arguments"] = arguments
        item.complete = True
        item.body["status"] = "completed"
        events += [
            self.event(
                "response.function_call_arguments.done",
                item_id=item.body["id"],
                output_index=index,
                name=name,
                arguments=arguments,
            ),
            self.event("response.output_item.done", output_index=index, item=dict(item.body)),
        ]
        return events

    # ---- the response object --------------------------------------------------------------------
    def body(self, status: str | None = None) -> dict[str, Any]:
        incomplete = self.finish_reason == "length"
        status = status or ("incomplete" if incomplete else "completed")
        usage = self.usage or Usage()
        return {
            "id": self.call.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.call.chat.model,
            "output": [_copy(item.body) for item in self.items] if status != "in_progress" else [],
            "reasoning": {"effort": None, "summary": None},
            "store": self.call.store,
            "truncation": "disabled",
            "user": None,
            **self.call.echo,
            "usage": None
            if status == "in_progress"
            else {
                "input_tokens": usage.input_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
        }

    def conversation(self) -> tuple[dict[str, Any], ...]:
        """The conversation this response ends, chat-shaped, for the next response to continue."""
        text = "".join("".join(item.text) for item in self.items if item.body["type"] == "message")
        calls = [
            {
                "id": item.body["call_id"],
                "type": "function",
                "function": {"name": item.body["name"], "arguments": item.body["arguments"]},
            }
            for item in self.items
            if item.body["type"] == "function_call" and item.complete
        ]
        answer: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            answer["tool_calls"] = calls
        return (*self.call.conversation, answer) if text or calls else self.call.conversation


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _copy(body: dict[str, Any]) -> dict[str, Any]:
    """An item as an event carries it: later changes to the item must not reach an event already built."""
    return {**body, "content": [dict(p) for p in body["content"]]} if "content" in body else dict(body)
