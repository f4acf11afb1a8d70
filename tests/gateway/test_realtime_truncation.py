"""session.truncation: the oldest conversation messages are left out of a prompt that would not fit."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from omni_gateway.gateway.realtime.errors import RealtimeError
from omni_gateway.gateway.realtime.truncation import (
    AUTO_RETENTION,
    PromptWindow,
    Truncation,
    fit_messages,
    parse_truncation,
    reply_reserve,
)
from omni_gateway.omni.protocol import Message, OmniRequest, TextPart, ToolCall
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import serve, until

TIMEOUT = 15


def msg(role: str, words: int, tag: str = "w", **kw: Any) -> Message:
    return Message(role, parts=(TextPart(" ".join([tag] * words)),), **kw)


class WordCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: tuple[Message, ...]) -> int:
        self.calls += 1
        return sum(len(m.text.split()) for m in messages)


def test_parse_truncation_accepts_the_three_forms_and_names_what_it_expected() -> None:
    assert parse_truncation("auto") == Truncation() == Truncation(retention_ratio=AUTO_RETENTION)
    assert parse_truncation("disabled") == Truncation(enabled=False)
    assert parse_truncation({"type": "retention_ratio", "retention_ratio": 0.5}) == Truncation(retention_ratio=0.5)
    for bad in (
        "off",
        None,
        {"type": "retention_ratio", "retention_ratio": 0},
        {"type": "retention_ratio"},
        {"type": "retention_ratio", "retention_ratio": 1.5},
        {"type": "retention_ratio", "retention_ratio": True},
        {"type": "retention_ratio", "retention_ratio": 0.5, "extra": 1},
    ):
        with pytest.raises(RealtimeError, match="session.truncation.*'auto', 'disabled'") as err:
            parse_truncation(bad)
        assert err.value.code == "invalid_value"


def test_reply_reserve_is_the_output_limit_capped_at_a_quarter_of_the_window() -> None:
    assert reply_reserve(100, None) == 25
    assert reply_reserve(100, 10) == 10
    assert reply_reserve(100_000, None) == 4096
    assert reply_reserve(3, None) == 1


def test_a_prompt_that_fits_is_sent_whole_after_one_count() -> None:
    messages = (msg("system", 5), msg("user", 10), msg("assistant", 10))
    count = WordCounter()
    assert fit_messages(messages, count, 100, None, Truncation()) == (messages, ())
    assert count.calls == 1


def test_the_smallest_cut_of_oldest_messages_that_fits_keeps_instructions_and_the_newest() -> None:
    body = tuple(msg("user" if i % 2 == 0 else "assistant", 10, tag=f"m{i}") for i in range(20))
    messages = (msg("system", 5),) + body
    count = WordCounter()
    exact = Truncation(retention_ratio=1.0)
    kept, dropped = fit_messages(messages, count, 100, None, exact)  # budget 75: 5 + 7 messages of 10
    assert kept == (messages[0],) + body[-7:] and dropped == body[:13]
    assert count.calls <= 2 + 5  # one check, then a binary search over 19 cut points
    half, dropped_half = fit_messages(messages, WordCounter(), 100, None, Truncation(retention_ratio=0.5))
    assert half == (messages[0],) + body[-3:] and len(dropped_half) == 17  # at most 37 of the 75
    auto, _ = fit_messages(messages, WordCounter(), 100, None, Truncation())
    assert auto == (messages[0],) + body[-5:]  # at most 60 of the 75: room for the next turns


def fit_in(window: PromptWindow, messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], int]:
    """One request through the session's window, as the connection runs it: the prompt and how much it cut."""
    fit = window.plan(Truncation())
    assert fit is not None
    fitted, cut = fit.apply(OmniRequest("resp_1", messages))
    window.cut = cut  # what the session records once the generation reports its cut
    return fitted.messages, len(cut)


def test_a_cut_stays_in_place_until_the_conversation_outgrows_the_room_again() -> None:
    window = PromptWindow(WordCounter(), 100)
    system = msg("system", 5)
    conversation: list[Message] = []
    prompts, left_out = [], []
    for turn in range(16):
        conversation.append(msg("user", 10, tag=f"t{turn}"))
        kept, dropped = fit_in(window, (system, *conversation))
        prompts.append(kept)
        left_out.append(dropped)
    # Room 75 words, auto cuts to 60: no cut up to 7 turns, then 3 more turns per cut.
    assert left_out == [0] * 7 + [3, 3, 3, 6, 6, 6, 9, 9, 9]
    for turn in range(1, 16):
        if left_out[turn] == left_out[turn - 1]:  # no new cut: the prompt extends the last one
            assert prompts[turn][: len(prompts[turn - 1])] == prompts[turn - 1]
    # A conversation that no longer starts with what was left out (an item deleted) is cut afresh.
    kept, dropped = fit_in(window, (system, *conversation[1:]))
    assert kept == (system, *conversation[-5:]) and dropped == 10


def test_a_window_without_a_counter_or_a_known_context_leaves_prompts_uncut() -> None:
    assert PromptWindow(None, 100).plan(Truncation()) is None
    assert PromptWindow(WordCounter(), 0).plan(Truncation()) is None
    assert PromptWindow(WordCounter(), 100).plan(Truncation(enabled=False)) is None


def test_a_cut_never_leaves_a_tool_result_without_its_call() -> None:
    call = ToolCall("call_1", "lookup", "{}")
    messages = (
        msg("user", 5),
        msg("assistant", 40, tool_calls=(call,)),
        msg("tool", 5, tool_call_id="call_1"),
        msg("assistant", 10),
        msg("user", 10),
    )
    kept, dropped = fit_messages(messages, WordCounter(), 80, None, Truncation(retention_ratio=1.0))  # 60 of 70
    # Dropping the first message leaves 65 words; dropping two would start with the orphaned tool result.
    assert kept == messages[3:] and dropped == messages[:3]


def test_when_the_newest_message_alone_is_too_long_it_is_what_remains() -> None:
    messages = (msg("system", 2), msg("user", 10), msg("user", 500))
    assert fit_messages(messages, WordCounter(), 100, None, Truncation()) == (
        (messages[0], messages[2]),
        (messages[1],),
    )


def test_disabled_sends_everything() -> None:
    messages = tuple(msg("user", 50) for _ in range(5))
    assert fit_messages(messages, WordCounter(), 100, None, Truncation(enabled=False)) == (messages, ())


def test_a_long_conversation_reaches_the_model_truncated_and_stays_whole() -> None:
    backend = FakeBackend()
    # Word-counting fake: a 100-token window keeps 25 for the reply, so 75 words of prompt, cut to 60.
    backend.capabilities = dataclasses.replace(backend.capabilities, max_context_tokens=100)

    async def go(port: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=omni-test") as ws:
            await until(ws, "conversation.created")
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "realtime", "output_modalities": ["text"], "instructions": "Be brief."},
                    }
                )
            )
            await until(ws, "session.updated")
            for i in range(10):
                await ws.send(
                    json.dumps(
                        {
                            "type": "conversation.item.create",
                            "item": {
                                "type": "message",
                                "role": "user",
                                "content": [{"type": "input_text", "text": " ".join([f"turn{i}"] * 10)}],
                            },
                        }
                    )
                )
                await until(ws, "conversation.item.done")
            await ws.send(json.dumps({"type": "response.create", "response": {"conversation": "none"}}))
            first = await until(ws, "response.done")
            await ws.send(
                json.dumps({"type": "session.update", "session": {"type": "realtime", "truncation": "bogus"}})
            )
            refused = await until(ws, "error")
            await ws.send(
                json.dumps({"type": "session.update", "session": {"type": "realtime", "truncation": "disabled"}})
            )
            await until(ws, "session.updated")
            await ws.send(json.dumps({"type": "response.create", "response": {"conversation": "none"}}))
            second = await until(ws, "response.done")
            return first + refused, second

    with serve(backend) as port:
        first, second = asyncio.run(asyncio.wait_for(go(port), TIMEOUT))
    assert first[-2]["response"]["status"] == "completed"
    assert first[-1]["error"]["code"] == "invalid_value" and first[-1]["error"]["param"] == "session.truncation"
    assert second[-1]["response"]["status"] == "completed"
    cut, whole = backend.requests
    assert [m.text for m in cut.messages] == ["Be brief."] + [" ".join([f"turn{i}"] * 10) for i in range(5, 10)]
    assert len(whole.messages) == 11  # disabled: every item, as the conversation still holds them


@contextlib.contextmanager
def real_session(tmp_path: Any, **session: Any) -> Iterator[tuple[Any, Any]]:
    """(pipeline, socket) of a text-only realtime session over the tiny real engine (256-token window)."""
    from websockets.sync.client import connect as sync_connect

    from tests.harness.real_engine import tiny_pipeline

    pipeline = tiny_pipeline(tmp_path, max_tokens=4)
    try:
        with serve(pipeline) as port, sync_connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
            ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "output_modalities": ["text"],
                            "instructions": "Answer in one word.",
                            **session,
                        },
                    }
                )
            )
            yield pipeline, ws
    finally:
        pipeline.shutdown()


def respond(ws: Any, **params: Any) -> dict[str, Any]:
    """Create a response and return it as response.done reports it."""
    ws.send(json.dumps({"type": "response.create", "response": params}))
    while True:
        event = json.loads(ws.recv(timeout=120))
        if event["type"] == "response.done":
            return event["response"]


def add_user_text(ws: Any, text: str) -> None:
    ws.send(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            }
        )
    )


def test_over_the_real_engine_a_conversation_past_the_window_still_gets_answers(tmp_path: Any) -> None:
    from tests.harness.real_engine import MAX_MODEL_LEN

    with real_session(tmp_path) as (pipeline, ws):
        text = "tell me about the quick brown fox that jumps over the lazy dog again and again"
        for _ in range(12):
            add_user_text(ws, text)
        whole = pipeline.count_tokens(tuple(Message("user", parts=(TextPart(text),)) for _ in range(12)))
        assert whole > MAX_MODEL_LEN  # the conversation no longer fits the window
        answered = respond(ws, conversation="none")
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "truncation": "disabled"}}))
        refused = respond(ws, conversation="none")
    # The tiny model rarely says EOS: a reply cut at max_tokens is "incomplete" by design.
    assert answered["status"] in ("completed", "incomplete"), answered
    assert 0 < answered["usage"]["input_tokens"] <= MAX_MODEL_LEN
    assert refused["status"] == "failed", refused


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_turns_after_a_cut_find_their_prefix_cached_only_when_the_cut_leaves_room(tmp_path: Any, ratio: float) -> None:
    """Past the window, a cut to the least that fits moves the prompt's start on every turn, so nothing
    past the instructions is ever cached again; a deeper cut lets the next turns reuse it. (Here a turn
    is a fifth of the 192-token room, more than auto's 20% headroom, hence 0.5.)"""
    usages = []
    with real_session(tmp_path, truncation={"type": "retention_ratio", "retention_ratio": ratio}) as (_, ws):
        for turn in range(14):
            add_user_text(ws, f"turn {turn}: tell me more about foxes")
            response = respond(ws)
            assert response["status"] in ("completed", "incomplete"), response
            usages.append(
                (response["usage"]["input_tokens"], response["usage"]["input_token_details"]["cached_tokens"])
            )
    print(f"\nretention_ratio {ratio}: per turn (prompt tokens, cached):", usages)
    cuts = [i for i in range(1, len(usages)) if usages[i][0] < usages[i - 1][0]]
    assert cuts, "the conversation never outgrew the window"
    after = usages[cuts[0] + 1 :]
    well_cached = [cached for prompt, cached in after if cached >= prompt // 2]
    if ratio < 1:
        assert well_cached, usages  # turns after the cut reuse the cut prompt's blocks
    else:
        assert not well_cached, usages  # every turn past the window is cut again, at a new start


def test_an_empty_prompt_is_not_counted() -> None:
    def count(messages: tuple[Message, ...]) -> int:
        raise AssertionError("counted an empty prompt")

    assert fit_messages((), count, 1000, None, Truncation()) == ((), ())
