"""Hermes-style calls, the format of Qwen2.5/Qwen3, Hermes fine-tunes and SmolLM2's templates: each call
is ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``, calls one after another, text around
them is content. An answer that is a bare call object (Llama 3's shape) is read as a call too."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from omni_gateway.omni.tools.calls import StreamEvent, tool_name, tool_parameters
from omni_gateway.omni.tools.grammar import calls_tag
from omni_gateway.omni.tools.stream import CallStream, split_at_marker

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesStream(CallStream):
    def __init__(self, tool_names: frozenset[str], *, forced: bool = False) -> None:
        super().__init__(tool_names, forced=forced)
        self._just_closed = False

    def _outside(self, final: bool) -> list[StreamEvent]:
        if self._state == "start":
            text = self._pending.lstrip()
            if not text and not final:
                return []  # undecided until the first visible character
            self._state = "outside"
            if text.startswith("{"):  # a bare JSON call, as Llama 3 templates ask for, reads the same
                self._begin_call(self._pending[: len(self._pending) - len(text)])
                self._pending = text
                return []
        if self._just_closed:
            # Whitespace right after a call separates calls: not content.
            self._pending = self._pending.lstrip()
            if not self._pending:
                return []
            self._just_closed = False
        before, marker, rest = split_at_marker(self._pending, OPEN, final=final)
        if marker is None:
            self._pending = rest
            return self._content(before)
        self._pending = rest
        content = before.rstrip()  # the whitespace before a call is the call's: restored if it is none
        self._begin_call(before[len(content) :] + marker)
        return self._content(content)

    def _after_call(self, final: bool) -> list[StreamEvent]:
        text = self._pending.lstrip()
        if text.startswith(CLOSE):
            self._pending = text[len(CLOSE) :]
        elif text and (not CLOSE.startswith(text) or final):
            self._pending = text  # a call without its closing tag: what follows is read as usual
        elif final:
            self._pending = ""  # cut off inside the closing tag: markup
        else:
            return []
        self._state, self._just_closed = "outside", True
        return []


def hermes_tag(tools: Sequence[dict[str, Any]], *, required: bool, parallel: bool) -> dict[str, Any]:
    """The structural tag of Hermes calls, each call's arguments following its tool's parameters."""
    tags = [(f'{OPEN}\n{{"name": {_quoted(t)}, "arguments": ', tool_parameters(t), f"}}\n{CLOSE}") for t in tools]
    return calls_tag(tags, separator="\n", trigger=OPEN, required=required, parallel=parallel)


def _quoted(tool: dict[str, Any]) -> str:
    return json.dumps(tool_name(tool), ensure_ascii=False)
