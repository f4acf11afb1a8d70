"""The incremental reader every tool-call format shares: text arrives piece by piece and leaves as content,
the start of each call, its argument pieces and the whole call.

A call is the JSON object ``{"name": ..., "arguments": {...}}`` (``"parameters"`` also names the
arguments, as Llama 3 writes them). Its arguments are read by bracket depth, outside JSON strings, so
they stream as they are generated and end exactly where their value ends. What surrounds the calls
(a ``<tool_call>`` tag, a ``[TOOL_CALLS]`` list, ``;`` between objects) is each format's own: a subclass
reads it in ``_outside``, ``_after_call`` and the states it adds.

A call cut off before its end (``max_tokens``) streams its pieces but never becomes a ``CallEnd``.
With ``forced`` (the grammar made the answer calls only) no text is ever content: whatever is not a
complete call is markup. A forced answer may hold several calls, but a model that calls the same function
with the same arguments again is looping: that repeat ends the answer (``ended``), unreported. So that a
repeat never goes out, every call after the first is held back until complete and then given whole (its
start, all its arguments as one piece, its end); the first streams as it is written.
"""

from __future__ import annotations

import json
import re

from omni_gateway.omni.tools.calls import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    ParsedCall,
    StreamEvent,
    new_call_id,
    strict_json,
)

_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
# A head is short (names are at most 64 characters): a longer text without one never becomes one.
_MAX_HEAD_CHARS = 256


def _literal_prefix(text: str) -> str:
    """A pattern of any proper start of ``text`` (the empty one included)."""
    pattern = ""
    for ch in reversed(text[:-1]):
        pattern = f"(?:{re.escape(ch)}{pattern})?"
    return pattern


def _head_prefix() -> re.Pattern[str]:
    """Text that is a call's head cut short: each part whole then the next begun, or the part itself begun."""
    string = r'"(?:[^"\\]|\\.)*'
    key = f'"(?:{_literal_prefix("arguments#")}|{_literal_prefix("parameters#")})'
    parts = [  # (the part whole, the part begun)
        (r"\{\s*", r"\{\s*"),
        ('"name"', _literal_prefix('"name"')),
        (r"\s*:\s*", r"\s*"),
        (string + '"', string + r"\\?"),
        (r"\s*,\s*", r"\s*"),
        ('"(?:arguments|parameters)"', key),
        (r"\s*:\s*", r"\s*"),
    ]
    pattern = ""
    for whole, begun in reversed(parts):
        pattern = f"(?:{whole}(?:{pattern})?|{begun})" if pattern else f"(?:{whole}|{begun})"
    return re.compile(pattern + r"\Z", re.DOTALL)


_HEAD_PREFIX = _head_prefix()
_CLOSERS = {"{": "}", "[": "]"}


class CallStream:
    """``feed`` each piece of text, then ``finish``; ``calls`` holds the complete calls so far."""

    def __init__(self, tool_names: frozenset[str], *, forced: bool = False) -> None:
        self._names = tool_names
        self._forced = forced
        self._pending = ""
        self._state = "start"
        self._markup = ""  # the format's text that led to the call being read: content if it is no call
        self._call: CallStart | None = None
        self._arguments: list[str] = []
        self._depth: list[str] = []  # closing brackets the arguments still owe
        self._in_string = self._escaped = self._args_done = False
        self._held = False  # the call being read goes out only once complete (a later call of a forced answer)
        self.calls: list[ParsedCall] = []
        self.ended = False  # a call repeated an earlier one: the answer is over, and the rest of the text ignored

    def feed(self, text: str) -> list[StreamEvent]:
        self._pending += text
        return self._drain(final=False)

    def finish(self) -> list[StreamEvent]:
        return self._drain(final=True)

    # ---- the format's parts: overridden ------------------------------------------------------------

    def _outside(self, final: bool) -> list[StreamEvent]:
        """Text in state "start"/"outside": content, or the markup that opens calls."""
        raise NotImplementedError

    def _after_call(self, final: bool) -> list[StreamEvent]:
        """Text in state "after": what closes a call or separates it from the next."""
        raise NotImplementedError

    def _other(self, final: bool) -> list[StreamEvent]:
        """Text in a state of the format's own."""
        raise NotImplementedError(self._state)

    # ---- shared -----------------------------------------------------------------------------------

    def _drain(self, *, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while True:
            before = (self._pending, self._state)
            if self.ended:
                self._pending = ""
                break
            if self._state in ("start", "outside"):
                events += self._outside(final)
            elif self._state == "head":
                events += self._head(final)
            elif self._state == "arguments":
                events += self._read_arguments(final)
            elif self._state == "close":
                events += self._close_object(final)
            elif self._state == "after":
                events += self._after_call(final)
            else:
                events += self._other(final)
            if (self._pending, self._state) == before:
                break
        if final:
            events += self._content(self._pending)
            self._pending = ""
        return [e for e in events if e != ""]

    def _content(self, text: str) -> list[StreamEvent]:
        return [] if self._forced or not text else [text]

    def _begin_call(self, markup: str) -> None:
        """The format's markup before a call was read: the call object comes next."""
        self._markup = markup
        self._state = "head"

    def _head(self, final: bool) -> list[StreamEvent]:
        text = self._pending.lstrip()
        if not text:
            return []
        head = _CALL_HEAD.match(text)
        if head is None:
            if len(text) >= _MAX_HEAD_CHARS or _HEAD_PREFIX.match(text) is None:
                return self._not_a_call()
            if not final:
                return []  # may still become a head
            # A call cut off in its head (max_tokens): markup, not content.
            self._pending, self._markup, self._state = "", "", "outside"
            return []
        try:
            name = json.loads(f'"{head.group(1)}"')
        except ValueError:  # an escape JSON has not (\x): no name of ours
            name = None
        if name not in self._names:
            return self._not_a_call()
        self._pending = text[head.end() :]
        self._call = CallStart(new_call_id(), name)
        self._arguments, self._depth = [], []
        self._in_string = self._escaped = self._args_done = False
        self._held = self._forced and bool(self.calls)
        self._state = "arguments"
        return [] if self._held else [self._call]

    def _not_a_call(self) -> list[StreamEvent]:
        """The markup and the text after it were no call of ours: content, then read on as content."""
        events = self._content(self._markup + self._pending)
        self._markup = self._pending = ""
        self._state = "outside"
        return events

    def _read_arguments(self, final: bool) -> list[StreamEvent]:
        call = self._call
        assert call is not None
        if not self._arguments:
            self._pending = self._pending.lstrip()
        end = self._scan(self._pending)
        piece, self._pending = self._pending[:end], self._pending[end:]
        events: list[StreamEvent] = [ArgumentsDelta(call.call_id, call.name, piece)] if piece and not self._held else []
        if piece:
            self._arguments.append(piece)
        if self._args_done:
            self._state = "close"
        elif final:  # cut off: the pieces went out, but the call never closed
            events += self._cut_off()
        return events

    def _cut_off(self) -> list[StreamEvent]:
        """The call being read never closed (max_tokens): its pieces go out, a held call's now, as one."""
        call = self._call
        assert call is not None
        events: list[StreamEvent] = []
        if self._held:
            events = [call, ArgumentsDelta(call.call_id, call.name, "".join(self._arguments))]
        self._call, self._pending, self._state = None, "", "outside"
        return events

    def _scan(self, text: str) -> int:
        """How much of ``text`` belongs to the arguments; sets ``_args_done`` where their value ends."""
        for i, ch in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                    if not self._depth:  # a string as the whole arguments value
                        self._args_done = True
                        return i + 1
            elif ch == '"':
                self._in_string = True
            elif ch in _CLOSERS:
                self._depth.append(_CLOSERS[ch])
            elif self._depth and ch == self._depth[-1]:
                self._depth.pop()
                if not self._depth:
                    self._args_done = True
                    return i + 1
            elif not self._depth and ch in ",}":  # a bare scalar ends at the object's next delimiter
                self._args_done = True
                return i
        return len(text)

    def _close_object(self, final: bool) -> list[StreamEvent]:
        """The call object's own ``}`` after its arguments; a call is complete only with it."""
        call = self._call
        assert call is not None
        text = self._pending.lstrip()
        if not text:
            # Cut off right after the arguments: still not a complete call.
            return self._cut_off() if final else []
        if text[0] == "}":
            text = text[1:]
        self._pending = text
        parsed = ParsedCall(call.call_id, call.name, strict_json("".join(self._arguments).strip()))
        self._call, self._markup, self._state = None, "", "after"
        if self._held and any(_same_call(parsed, earlier) for earlier in self.calls):
            self.ended, self._pending = True, ""
            return []
        self.calls.append(parsed)
        if self._held:
            return [call, ArgumentsDelta(call.call_id, call.name, parsed.arguments), CallEnd(parsed)]
        return [CallEnd(parsed)]


def _same_call(a: ParsedCall, b: ParsedCall) -> bool:
    """The same function with the same arguments, compared as JSON values (key order and spacing aside)."""
    return a.name == b.name and _canonical(a.arguments) == _canonical(b.arguments)


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_at_marker(text: str, marker: str, *, final: bool) -> tuple[str, str | None, str]:
    """(text before ``marker``, the marker or None, the rest kept for later). Without the marker the
    end of ``text`` that may still become it is kept, unless ``final``."""
    start = text.find(marker)
    if start >= 0:
        return text[:start], marker, text[start + len(marker) :]
    keep = 0 if final else partial_suffix(text, marker)
    return text[: len(text) - keep], None, text[len(text) - keep :]
