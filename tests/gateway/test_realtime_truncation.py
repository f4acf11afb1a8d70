"""session.truncation: the oldest conversation messages are left out of a prompt that would not fit."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest
from websockets.asyncio.client import connect

from fakes import FakeBackend
from gateway.realtime.errors import RealtimeError
from gateway.realtime.truncation import AUTO_RETENTION, Truncation, fit_messages, parse_truncation, reply_reserve
from live_server import serve, until
from omni.protocol import Message, TextPart, ToolCall

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
    for bad in ("off", None, {"type": "retention_ratio", "retention_ratio": 0}, {"type": "retention_ratio"},
                {"type": "retention_ratio", "retention_ratio": 1.5}, {"type": "retention_ratio", "retention_ratio": True},
                {"type": "retention_ratio", "retention_ratio": 0.5, "extra": 1}):
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
    assert fit_messages(messages, count, 100, None, Truncation()) == (messages, 0)
    assert count.calls == 1


def test_the_smallest_cut_of_oldest_messages_that_fits_keeps_instructions_and_the_newest() -> None:
    body = tuple(msg("user" if i % 2 == 0 else "assistant", 10, tag=f"m{i}") for i in range(20))
    messages = (msg("system", 5),) + body
    count = WordCounter()
    exact = Truncation(retention_ratio=1.0)
    kept, dropped = fit_messages(messages, count, 100, None, exact)  # budget 75: 5 + 7 messages of 10
    assert kept == (messages[0],) + body[-7:] and dropped == 13
    assert count.calls <= 2 + 5  # one check, then a binary search over 19 cut points
    half, dropped_half = fit_messages(messages, WordCounter(), 100, None, Truncation(retention_ratio=0.5))
    assert half == (messages[0],) + body[-3:] and dropped_half == 17  # at most 37 of the 75
    auto, _ = fit_messages(messages, WordCounter(), 100, None, Truncation())
    assert auto == (messages[0],) + body[-5:]  # at most 60 of the 75: room for the next turns


def test_a_cut_never_leaves_a_tool_result_without_its_call() -> None:
    call = ToolCall("call_1", "lookup", "{}")
    messages = (msg("user", 5), msg("assistant", 40, tool_calls=(call,)), msg("tool", 5, tool_call_id="call_1"),
                msg("assistant", 10), msg("user", 10))
    kept, dropped = fit_messages(messages, WordCounter(), 80, None, Truncation(retention_ratio=1.0))  # 60 of 70
    # Dropping the first message leaves 65 words; dropping two would start with the orphaned tool result.
    assert kept == messages[3:] and dropped == 3


def test_when_the_newest_message_alone_is_too_long_it_is_what_remains() -> None:
    messages = (msg("system", 2), msg("user", 10), msg("user", 500))
    assert fit_messages(messages, WordCounter(), 100, None, Truncation()) == ((messages[0], messages[2]), 1)


def test_disabled_sends_everything() -> None:
    messages = tuple(msg("user", 50) for _ in range(5))
    assert fit_messages(messages, WordCounter(), 100, None, Truncation(enabled=False)) == (messages, 0)


def test_a_long_conversation_reaches_the_model_truncated_and_stays_whole() -> None:
    backend = FakeBackend()
    # Word-counting fake: a 100-token window keeps 25 for the reply, so 75 words of prompt, cut to 60.
    backend.capabilities = dataclasses.replace(backend.capabilities, max_context_tokens=100)

    async def go(port: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=fake-omni") as ws:
            await until(ws, "conversation.created")
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "output_modalities": ["text"], "instructions": "Be brief."}}))
            await until(ws, "session.updated")
            for i in range(10):
                await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": " ".join([f"turn{i}"] * 10)}]}}))
                await until(ws, "conversation.item.done")
            await ws.send(json.dumps({"type": "response.create", "response": {"conversation": "none"}}))
            first = await until(ws, "response.done")
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "truncation": "bogus"}}))
            refused = await until(ws, "error")
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                            "truncation": "disabled"}}))
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


def test_over_the_real_engine_a_conversation_past_the_window_still_gets_answers(tmp_path: Any) -> None:
    from websockets.sync.client import connect as sync_connect

    from tests.gateway.real_engine import MAX_MODEL_LEN, tiny_pipeline

    pipeline = tiny_pipeline(tmp_path, max_tokens=4)

    def respond(ws: Any) -> dict[str, Any]:
        ws.send(json.dumps({"type": "response.create", "response": {"conversation": "none"}}))
        while True:
            event = json.loads(ws.recv(timeout=120))
            if event["type"] == "response.done":
                return event["response"]

    try:
        with serve(pipeline) as port, sync_connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
            ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "output_modalities": ["text"], "instructions": "Answer in one word."}}))
            text = "tell me about the quick brown fox that jumps over the lazy dog again and again"
            for _ in range(12):
                ws.send(json.dumps({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
            whole = pipeline.count_tokens(tuple(Message("user", parts=(TextPart(text),)) for _ in range(12)))
            assert whole > MAX_MODEL_LEN  # the conversation no longer fits the window
            answered = respond(ws)
            ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                      "truncation": "disabled"}}))
            refused = respond(ws)
    finally:
        pipeline.shutdown()
    # The tiny model rarely says EOS: a reply cut at max_tokens is "incomplete" by design.
    assert answered["status"] in ("completed", "incomplete"), answered
    assert 0 < answered["usage"]["input_tokens"] <= MAX_MODEL_LEN
    assert refused["status"] == "failed", refused
