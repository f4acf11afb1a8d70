"""Mistral calls: ``[TOOL_CALLS]`` then a JSON list of ``{"name": ..., "arguments": {...}}`` objects;
text before the marker is content. ``[TOOL_CALLS]`` is a special token, which decoding may drop: a list
of calls at the very start of the answer reads the same. A forced call is written as that bare list, so
its grammar never needs the special token."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from omni_gateway.omni.tools.calls import StreamEvent, tool_name, tool_parameters
from omni_gateway.omni.tools.grammar import calls_tag
from omni_gateway.omni.tools.stream import CallStream, split_at_marker

MARKER = "[TOOL_CALLS]"


class MistralStream(CallStream):
    def _outside(self, final: bool) -> list[StreamEvent]:
        if self._state == "start":
            text = self._pending.lstrip()
            if not text or (not final and text == "["):
                return []
            self._state = "outside"
            if text.startswith("[") and text[1:].lstrip().startswith("{"):
                self._pending, self._state = text[1:], "list"
                self._markup = "["
                return []
        before, marker, rest = split_at_marker(self._pending, MARKER, final=final)
        self._pending = rest
        if marker is None:
            return self._content(before)
        content = before.rstrip()  # the whitespace before the calls is theirs: restored if they are none
        self._state, self._markup = "marker", before[len(content) :] + marker
        return self._content(content)

    def _other(self, final: bool) -> list[StreamEvent]:
        text = self._pending.lstrip()
        if not text:
            return self._not_a_call() if final else []
        if self._state == "marker":  # after [TOOL_CALLS]: a list of calls, or one call
            if text.startswith("["):
                self._markup += self._pending[: len(self._pending) - len(text) + 1]
                self._pending, self._state = text[1:], "list"
            else:
                self._begin_call(self._markup)
            return []
        self._begin_call(self._markup)  # "list": the next call object
        return []

    def _after_call(self, final: bool) -> list[StreamEvent]:
        text = self._pending.lstrip()
        if not text and not final:
            return []
        if text.startswith(","):
            self._pending, self._state, self._markup = text[1:], "list", ""
        else:
            self._pending, self._state = text.removeprefix("]"), "outside"
        return []


def mistral_tag(tools: Sequence[dict[str, Any]], *, required: bool, parallel: bool) -> dict[str, Any] | None:
    """The structural tag of forced Mistral calls (a bare list); None for unforced ones, which the model
    opens with its special token (a grammar over text cannot name it), parsed afterwards."""
    if not required:
        return None
    tags = [
        (f'{{"name": {json.dumps(tool_name(t), ensure_ascii=False)}, "arguments": ', tool_parameters(t), "}")
        for t in tools
    ]
    return calls_tag(
        tags, separator=", ", trigger=None, required=True, parallel=parallel, list_open="[", list_close="]"
    )
