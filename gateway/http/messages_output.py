"""Backend output chunks -> an Anthropic ``message`` object and its streamed events. Pure.

Text streams as it comes. A tool call goes out as one ``tool_use`` block once its arguments are complete:
Anthropic's clients parse a block's ``input`` when the block stops, so a call cut off by ``max_tokens``
is left out rather than sent as JSON that does not parse.
"""

from __future__ import annotations

import json
from typing import Any

from omni_gateway.gateway.http.errors import from_backend
from omni_gateway.gateway.http.messages_request import MessagesCall
from omni_gateway.omni.protocol import Done, Error, OutputChunk, TextDelta, ToolCallDelta, Usage

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "abort": "end_turn", "tool_calls": "tool_use"}


class MessageAssembler:
    """Folds one message's chunk stream; ``start``, ``feed`` and ``finish`` return the events to stream."""

    def __init__(self, call: MessagesCall, input_tokens: int) -> None:
        self.call = call
        self.input_tokens = input_tokens  # counted before the generation: message_start reports it
        self.blocks: list[dict[str, Any]] = []
        self._text_open = False
        self.usage: Usage | None = None
        self.finish_reason = "stop"
        self.stop_sequence: str | None = None

    def start(self) -> list[dict[str, Any]]:
        message = {**self._envelope(), "content": [], "stop_reason": None, "stop_sequence": None}
        message["usage"] = {"input_tokens": self.input_tokens, "output_tokens": 0}
        return [{"type": "message_start", "message": message}]

    def feed(self, chunk: OutputChunk) -> list[dict[str, Any]]:
        """Record ``chunk``; an ``Error`` chunk raises the ``ApiError`` it maps to."""
        if isinstance(chunk, Error):
            raise from_backend(chunk)
        if isinstance(chunk, Usage):
            self.usage = chunk
        elif isinstance(chunk, Done):
            self.finish_reason, self.stop_sequence = chunk.finish_reason, chunk.stop_sequence
        elif isinstance(chunk, TextDelta) and chunk.text:
            return self._text(chunk.text)
        elif isinstance(chunk, ToolCallDelta):
            return self._tool_use(chunk)
        return []  # argument pieces wait for their complete call

    def finish(self) -> list[dict[str, Any]]:
        events = self._close_text()
        delta = {"stop_reason": self.stop_reason, "stop_sequence": self._stopped_by}
        events.append({"type": "message_delta", "delta": delta, "usage": {"output_tokens": self._output_tokens}})
        return [*events, {"type": "message_stop"}]

    def _text(self, text: str) -> list[dict[str, Any]]:
        events = []
        if not self._text_open:
            self._text_open = True
            self.blocks.append({"type": "text", "text": ""})
            events.append(
                {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(self.blocks[-1])}
            )
        self.blocks[-1]["text"] += text
        delta = {"type": "text_delta", "text": text}
        return [*events, {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}]

    def _close_text(self) -> list[dict[str, Any]]:
        if not self._text_open:
            return []
        self._text_open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def _tool_use(self, chunk: ToolCallDelta) -> list[dict[str, Any]]:
        events = self._close_text()
        try:
            arguments = json.loads(chunk.arguments or "{}")
        except ValueError:
            return events  # not a call a client could run
        if not isinstance(arguments, dict):
            arguments = {"value": arguments}
        block = {"type": "tool_use", "id": chunk.call_id, "name": chunk.name, "input": arguments}
        self.blocks.append(block)
        index = len(self.blocks) - 1
        partial = json.dumps(arguments, ensure_ascii=False)
        return [
            *events,
            {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}},
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": partial},
            },
            {"type": "content_block_stop", "index": index},
        ]

    @property
    def stop_reason(self) -> str:
        if any(b["type"] == "tool_use" for b in self.blocks) and self.finish_reason != "length":
            return "tool_use"
        if self._stopped_by is not None:
            return "stop_sequence"
        return _STOP_REASONS.get(self.finish_reason, "end_turn")

    @property
    def _stopped_by(self) -> str | None:
        """The stop sequence that ended the answer (Anthropic names it), when one did."""
        return self.stop_sequence if self.finish_reason == "stop" else None

    @property
    def _output_tokens(self) -> int:
        return self.usage.output_tokens if self.usage is not None else 0

    def _envelope(self) -> dict[str, Any]:
        return {"id": self.call.message_id, "type": "message", "role": "assistant", "model": self.call.chat.model}

    def body(self) -> dict[str, Any]:
        usage = self.usage or Usage(input_tokens=self.input_tokens)
        return {
            **self._envelope(),
            "content": self.blocks,
            "stop_reason": self.stop_reason,
            "stop_sequence": self._stopped_by,
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_input_tokens": usage.cached_tokens,
                "cache_creation_input_tokens": 0,
            },
        }
