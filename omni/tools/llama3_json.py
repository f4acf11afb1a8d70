"""Llama 3.x JSON calls: the answer opens with ``{"name": ..., "parameters": {...}}`` (after an optional
``<|python_tag|>``), several calls separated by ``;``. An answer that opens otherwise is content, as is
text after the last call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from omni_gateway.omni.tools.calls import StreamEvent, tool_name, tool_parameters
from omni_gateway.omni.tools.grammar import calls_tag
from omni_gateway.omni.tools.stream import CallStream

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = "; "
HEAD = '{"name": '


class Llama3JsonStream(CallStream):
    def _outside(self, final: bool) -> list[StreamEvent]:
        if self._state == "outside":  # no call at the start: the rest is content
            events, self._pending = self._content(self._pending), ""
            return events
        text = self._pending.lstrip()
        if not text or (not final and PYTHON_TAG.startswith(text)):
            return []
        markup = self._pending[: len(self._pending) - len(text)]
        if text.startswith(PYTHON_TAG):
            markup += PYTHON_TAG
            text = text[len(PYTHON_TAG) :]
        if text.lstrip().startswith("{"):
            self._pending = text
            self._begin_call(markup)
        else:
            self._state = "outside"
        return []

    def _after_call(self, final: bool) -> list[StreamEvent]:
        text = self._pending.lstrip()
        if not text and not final:
            return []
        if text.startswith(";"):
            self._pending = text[1:]
            self._begin_call("")
        else:
            self._pending, self._state = text, "outside"
        return []


def llama3_json_tag(tools: Sequence[dict[str, Any]], *, required: bool, parallel: bool) -> dict[str, Any]:
    """The structural tag of Llama 3 JSON calls, each call's arguments following its tool's parameters."""
    tags = [
        (f'{HEAD}{json.dumps(tool_name(t), ensure_ascii=False)}, "parameters": ', tool_parameters(t), "}")
        for t in tools
    ]
    return calls_tag(tags, separator=SEPARATOR, trigger=HEAD, required=required, parallel=parallel)
