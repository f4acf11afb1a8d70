"""``session.truncation``: fitting a long conversation into the model's context window.

When a prompt would not leave room for the reply, the oldest conversation messages are dropped
from it: ``{"type": "retention_ratio", "retention_ratio": r}`` drops down to ``r`` of that room in
one go, ``"auto"`` (the default) down to ``AUTO_RETENTION`` of it, and ``"disabled"`` sends
everything and lets an over-long prompt fail. The cut stays where it is (the session's ``PromptWindow``)
until the conversation outgrows the room again. Only what the model reads is cut: the conversation keeps
every item, and the instructions (system messages) and the newest message always stay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni_gateway.gateway.realtime.errors import invalid_value
from omni_gateway.omni.protocol import Message, OmniRequest

# Room kept for the reply when the response sets no output limit (OpenAI keeps 4,096 tokens of
# a 32k window), capped at a quarter of smaller windows.
DEFAULT_REPLY_TOKENS = 4096
# A cut changes where the prompt's conversation starts, so the prefix cache holds nothing past the
# instructions and the whole rest is prefilled again. Cutting only as much as the turn needs would
# make every later turn pay that again; cutting to 80% of the room leaves several turns' growth
# that find their prefix cached before the next cut.
AUTO_RETENTION = 0.8


@dataclass(frozen=True, slots=True)
class Truncation:
    enabled: bool = True
    retention_ratio: float = AUTO_RETENTION  # share of the room a cut leaves filled


def parse_truncation(raw: Any, param: str = "session.truncation") -> Truncation:
    expected = "'auto', 'disabled' or {'type': 'retention_ratio', 'retention_ratio': a number in (0, 1]}"
    if raw == "auto":
        return Truncation()
    if raw == "disabled":
        return Truncation(enabled=False)
    if isinstance(raw, dict) and raw.get("type") == "retention_ratio" and set(raw) <= {"type", "retention_ratio"}:
        ratio = raw.get("retention_ratio")
        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 1:
            return Truncation(retention_ratio=float(ratio))
    raise invalid_value(param, expected, raw)


def reply_reserve(context_tokens: int, max_output_tokens: int | None) -> int:
    """Tokens kept free for the reply: its output limit, at most a quarter of the window."""
    wanted = max_output_tokens if max_output_tokens is not None else DEFAULT_REPLY_TOKENS
    return max(1, min(wanted, context_tokens // 4))


def fit_messages(
    messages: tuple[Message, ...],
    count: Callable[[tuple[Message, ...]], int],
    context_tokens: int,
    max_output_tokens: int | None,
    truncation: Truncation,
    previous_cut: tuple[Message, ...] = (),
) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """The prompt to send and the oldest conversation messages left out of it.

    ``previous_cut`` is what the session's last prompt left out: while the conversation still starts
    with it, the prompt starts where that one did, and is cut further only once it outgrows the room.
    ``count`` gives a prompt's tokens; it runs once, or O(log n) times when a cut is due. A cut never
    starts the conversation with a tool result whose call it dropped. When even the newest message
    alone is too long, that message is what remains (the engine then refuses it).
    """
    if not truncation.enabled or not messages:  # an empty prompt has nothing to count (the session refuses it)
        return messages, ()
    head = 0
    while head < len(messages) and messages[head].role == "system":
        head += 1
    instructions, body = messages[:head], messages[head:]
    first = len(previous_cut)
    if not 0 < first < len(body) or body[:first] != previous_cut:
        first = 0
    budget = context_tokens - reply_reserve(context_tokens, max_output_tokens)
    if count(instructions + body[first:]) <= budget or len(body) - first < 2:
        return instructions + body[first:], body[:first]
    target = max(1, int(budget * truncation.retention_ratio))

    def start_after(drop: int) -> int:
        while drop < len(body) - 1 and body[drop].role == "tool":
            drop += 1
        return drop

    # The smallest further cut that reaches the target; prompts only shrink as more is dropped.
    lo, hi = first + 1, len(body) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if count(instructions + body[start_after(mid) :]) <= target:
            hi = mid
        else:
            lo = mid + 1
    cut = start_after(lo)
    return instructions + body[cut:], body[:cut]


@dataclass(frozen=True, slots=True)
class PromptFit:
    """Fitting one request's prompt into the context window, from where the session's window stood when
    the request was built. Pure apart from ``count`` (which renders and tokenizes: run it off the event
    loop); the cut it returns goes back to the session's window."""

    count: Callable[[tuple[Message, ...]], int]
    context_tokens: int
    truncation: Truncation
    previous_cut: tuple[Message, ...] = ()

    def apply(self, request: OmniRequest) -> tuple[OmniRequest, tuple[Message, ...]]:
        """``request`` without the oldest conversation messages, and those messages."""
        kept, cut = fit_messages(
            request.messages,
            self.count,
            self.context_tokens,
            request.sampling.max_tokens,
            self.truncation,
            self.previous_cut,
        )
        return (dataclasses.replace(request, messages=kept) if cut else request), cut


class PromptWindow:
    """Where a session's prompts start. A cut stays in place until the conversation outgrows the room
    again, so the turns in between extend a prompt whose prefix the KV cache holds. ``count`` is the
    backend's token counter; without it, or without a known context window, prompts go out uncut."""

    def __init__(self, count: Callable[[tuple[Message, ...]], int] | None, context_tokens: int) -> None:
        self.cut: tuple[Message, ...] = ()
        self._count = count
        self._context_tokens = context_tokens

    def plan(self, truncation: Truncation) -> PromptFit | None:
        """How the next request is to be fitted; None when it goes out as it is."""
        if self._count is None or not truncation.enabled or self._context_tokens <= 0:
            return None
        return PromptFit(self._count, self._context_tokens, truncation, self.cut)
