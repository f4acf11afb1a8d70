"""Find function calls in generated text.

Chat templates of Qwen2.5/Qwen3, Hermes-style fine-tunes and SmolLM2 ask the model to answer
with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; Llama 3.x answers with a bare JSON
object ``{"name": ..., "parameters": {...}}``. Both are parsed; anything else is plain text.

``tool_call_tag`` is the xgrammar structural tag that makes the tagged form the only way to call a
tool and its arguments valid against the tool's ``parameters`` (decoding follows it, so the calls
always parse). ``ToolCallStream`` splits text that arrives piece by piece into content, the start of
each call and its argument text, so arguments stream as they are generated.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_MAX_HEAD_CHARS = 256
# Whitespace between the arguments' JSON tokens: one character a run. Arguments are machine-read, and a
# small model sampling at temperature 1 otherwise spends its token budget on blank lines mid-call.
_MAX_WHITESPACE = 1
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass(frozen=True, slots=True)
class ParsedCall:
    call_id: str
    name: str
    arguments: str  # JSON text


def parse_tool_calls(text: str, tool_names: frozenset[str]) -> tuple[str, list[ParsedCall]]:
    """Split ``text`` into (content without the calls, calls). Only names in ``tool_names`` count."""
    calls: list[ParsedCall] = []
    for body in _TAGGED.findall(text):
        call = _call_from_json(body, tool_names)
        if call is not None:
            calls.append(call)
    if calls:
        return _TAGGED.sub("", text).strip(), calls
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        call = _call_from_json(stripped, tool_names)
        if call is not None:
            return "", [call]
    return text, []


def _call_from_json(body: str, tool_names: frozenset[str]) -> ParsedCall | None:
    try:
        # Lenient about raw control characters inside strings: the JSON grammar lets a tab through.
        obj = json.loads(body, strict=False)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in tool_names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        arguments = args
    else:
        arguments = json.dumps(args, ensure_ascii=False)
    return ParsedCall(call_id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"], arguments=arguments)


def tool_name(tool: dict[str, Any]) -> str:
    """The name of a tool in either shape: chat's ``{"function": {"name": ...}}`` or the flat one."""
    name = tool.get("name") or tool.get("function", {}).get("name")
    return str(name)


def tool_call_tag(tools: Sequence[dict[str, Any]], *, required: bool, parallel: bool) -> dict[str, Any]:
    """The structural tag of tool calls in the tagged form, one tag per tool with its parameters as the
    arguments' schema. ``required``: the answer is calls only, at least one; otherwise free text in
    which ``<tool_call>`` starts a constrained call. ``parallel``: more than one call may follow."""
    tags = []
    for tool in tools:
        fn = tool.get("function", tool)
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        tags.append(
            {
                "type": "tag",
                "begin": f'{OPEN}\n{{"name": {json.dumps(tool_name(tool), ensure_ascii=False)}, "arguments": ',
                "content": {"type": "json_schema", "json_schema": params, "max_whitespace_cnt": _MAX_WHITESPACE},
                "end": f"}}\n{CLOSE}",
            }
        )
    if required:
        calls: dict[str, Any] = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
    else:
        calls = {"type": "triggered_tags", "triggers": [OPEN], "tags": tags, "stop_after_first": not parallel}
    return {"type": "structural_tag", "format": calls}


@dataclass(frozen=True, slots=True)
class CallStart:
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    call_id: str
    name: str
    delta: str


@dataclass(frozen=True, slots=True)
class CallEnd:
    call: ParsedCall


StreamEvent = str | CallStart | ArgumentsDelta | CallEnd  # a str is content


class ToolCallStream:
    """Incremental ``parse_tool_calls`` of the tagged form: ``feed`` each piece of text, then
    ``finish``. A call cut off before its end streams its pieces but never becomes a ``CallEnd``.
    Content is released as soon as it cannot be the start of ``<tool_call>``; a call's
    arguments as soon as they cannot be its closing ``}`` and ``</tool_call>``. Text that opens with
    ``{`` is held to the end and parsed whole, for models that call with a bare JSON object."""

    def __init__(self, tool_names: frozenset[str]) -> None:
        self._names = tool_names
        self._pending = ""
        self._call: CallStart | None = None
        self._arguments: list[str] = []
        self._bare: bool | None = None  # undecided until the first non-blank character
        self._after_call = False  # whitespace right after a call separates calls: not content
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> list[StreamEvent]:
        self._pending += text
        if self._bare is None and self._pending.strip():
            self._bare = self._pending.lstrip().startswith("{")
        if self._bare is not False:
            return []
        return self._drain(final=False)

    def finish(self) -> list[StreamEvent]:
        if self._bare:
            content, calls = parse_tool_calls(self._pending, self._names)
            self._pending = ""
            self.calls += calls
            events: list[StreamEvent] = [content] if content else []
            for call in calls:
                events += [CallStart(call.call_id, call.name), ArgumentsDelta(call.call_id, call.name, call.arguments)]
                events.append(CallEnd(call))
            return events
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while True:
            before = (self._pending, self._call)
            events += self._in_call(final) if self._call is not None else self._outside(final)
            if (self._pending, self._call) == before:
                return [e for e in events if e != ""]

    def _outside(self, final: bool) -> list[StreamEvent]:
        if self._after_call:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return []
            self._after_call = False
        start = self._pending.find(OPEN)
        if start < 0:
            keep = 0 if final else _partial_suffix(self._pending, OPEN)
            content = self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(content) :]
            return [content]
        head = _CALL_HEAD.match(self._pending, start + len(OPEN))
        if head is None:
            if not final and _could_become_head(self._pending[start + len(OPEN) :]):
                content, self._pending = self._pending[:start], self._pending[start:]
                return [content]
            # Not a call of the tagged form: the text stays content.
            end = start + len(OPEN)
            content, self._pending = self._pending[:end], self._pending[end:]
            return [content]
        name = json.loads(f'"{head.group(1)}"')
        if name not in self._names:
            end = head.end()
            content, self._pending = self._pending[:end], self._pending[end:]
            return [content]
        content = self._pending[:start]
        self._pending = self._pending[head.end() :]
        self._call = CallStart(f"call_{uuid.uuid4().hex[:24]}", name)
        self._arguments = []
        return [content.rstrip() if content.strip() else "", self._call]

    def _in_call(self, final: bool) -> list[StreamEvent]:
        call = self._call
        assert call is not None
        released = "".join(self._arguments)
        close = _close_outside_strings(released + self._pending) - len(released)
        if close >= 0:
            body = self._pending[:close].rstrip()
            if body.endswith("}"):
                body = body[:-1]
            self._pending = self._pending[close + len(CLOSE) :]
            self._after_call = True
            return self._close(body)
        if final:  # cut off (max_tokens): the pieces went out, but the call never closed
            rest, self._pending, self._call = self._pending, "", None
            return [ArgumentsDelta(call.call_id, call.name, rest)] if rest else []
        if not self._arguments:
            self._pending = self._pending.lstrip()
        keep = _closing_suffix(self._pending)
        delta = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(delta) :]
        if not delta:
            return []
        self._arguments.append(delta)
        return [ArgumentsDelta(call.call_id, call.name, delta)]

    def _close(self, tail: str) -> list[StreamEvent]:
        call = self._call
        assert call is not None
        tail = tail if self._arguments else tail.lstrip()
        self._arguments.append(tail)
        parsed = ParsedCall(call.call_id, call.name, _strict_json("".join(self._arguments).strip()))
        self.calls.append(parsed)
        self._call = None
        events: list[StreamEvent] = [ArgumentsDelta(call.call_id, call.name, tail)] if tail else []
        return [*events, CallEnd(parsed)]


def _strict_json(text: str) -> str:
    """``text`` unchanged where strict JSON parsers read it; re-serialized where it holds a raw control
    character in a string (the JSON grammar lets a tab through), so the final arguments always parse."""
    try:
        json.loads(text)
        return text
    except ValueError:
        pass
    try:
        return json.dumps(json.loads(text, strict=False), ensure_ascii=False)
    except ValueError:
        return text  # not JSON at all (a call cut off): left for the caller to report


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _close_outside_strings(body: str) -> int:
    """Where ``</tool_call>`` first occurs in ``body`` outside a JSON string; -1 if nowhere."""
    in_string = escaped = False
    for i, ch in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "<" and body.startswith(CLOSE, i):
            return i
    return -1


def _could_become_head(text: str) -> bool:
    """Whether more text could still make ``text`` (what follows ``<tool_call>``) a call's head: a
    head is short (names are at most 64 characters), so a long text without one never will."""
    return CLOSE not in text and len(text) < _MAX_HEAD_CHARS


def _closing_suffix(text: str) -> int:
    """How much of the end of a call's text may still be its closing ``}`` and ``</tool_call>``."""
    match = re.search(r"\}?\s*$", text)
    tail = 0 if match is None else len(text) - match.start()
    partial = _partial_suffix(text, CLOSE)
    if partial:
        rest = text[: len(text) - partial]
        match = re.search(r"\}?\s*$", rest)
        tail = partial + (0 if match is None else len(rest) - match.start())
    return tail
