"""/v1/messages through the official anthropic SDK (typed messages and events) against a live server."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import (
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    TextBlock,
    ToolUseBlock,
)
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.omni.protocol import Done, ImagePart, TextDelta, ToolCallArguments, ToolCallDelta, Usage

from tests.harness.fake_backend import FakeBackend, overloaded, png
from tests.harness.live_server import serve

MODEL = "omni-test"
USER = [{"role": "user", "content": "hi there"}]
TOOLS = [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}]
CALL_SCRIPT = [
    TextDelta("Checking."),
    ToolCallArguments("call_1", "get_weather", '{"city": "Par'),
    ToolCallDelta("call_1", "get_weather", '{"city": "Paris"}'),
    Done("stop"),
    Usage(input_tokens=5, output_tokens=9),
]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[FakeBackend, str]]:
    backend = FakeBackend()
    with serve(backend, GatewayConfig(api_key="sk-test")) as port:
        yield backend, f"http://127.0.0.1:{port}"


@pytest.fixture
def live(server: tuple[FakeBackend, str]) -> tuple[FakeBackend, str, anthropic.Anthropic]:
    server[0].reset()
    return server[0], server[1], anthropic.Anthropic(base_url=server[1], api_key="sk-test", max_retries=0, timeout=20)


def test_a_message_with_system_stop_sequences_and_sampling(live):
    backend, _, client = live
    m = client.messages.create(
        model=MODEL,
        max_tokens=64,
        system="Be brief.",
        messages=USER,
        stop_sequences=["zzz"],
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20},  # this SDK release dropped the arguments
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    (block,) = m.content
    assert isinstance(block, TextBlock) and block.text == "hello from the fake model"
    assert m.stop_reason == "end_turn" and m.usage.output_tokens == 5 and m.usage.input_tokens == 4
    sent = backend.requests[-1]
    assert [(x.role, x.text) for x in sent.messages] == [("system", "Be brief."), ("user", "hi there")]
    s = sent.sampling
    assert (s.max_tokens, s.stop, s.temperature, s.top_p, s.top_k) == (64, ("zzz",), 0.5, 0.9, 20)


def test_max_tokens_is_the_stop_reason_when_it_cuts(live):
    _, _, client = live
    m = client.messages.create(model=MODEL, max_tokens=2, messages=USER)
    assert m.stop_reason == "max_tokens" and m.content[0].text == "hello from"


def test_streamed_events_and_the_sdk_stream_helper(live):
    _, _, client = live
    events = list(client.messages.create(model=MODEL, max_tokens=64, messages=USER, stream=True))
    kinds = [type(e) for e in events]
    assert kinds[:2] == [RawMessageStartEvent, RawContentBlockStartEvent]
    assert kinds[-3:] == [RawContentBlockStopEvent, RawMessageDeltaEvent, RawMessageStopEvent]
    assert events[0].message.usage.input_tokens == 2
    deltas = [e.delta.text for e in events if isinstance(e, RawContentBlockDeltaEvent)]
    assert "".join(deltas) == "hello from the fake model"
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == 5
    with client.messages.stream(model=MODEL, max_tokens=64, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == "hello from the fake model"


def test_tool_use_streamed_and_whole(live):
    backend, _, client = live
    backend.script = CALL_SCRIPT
    with client.messages.stream(model=MODEL, max_tokens=64, messages=USER, tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(e.type == "input_json" for e in events)  # the SDK's own accumulation of input_json_delta
    text, call = final.content
    assert isinstance(text, TextBlock) and text.text == "Checking."
    assert isinstance(call, ToolUseBlock) and call.input == {"city": "Paris"} and call.id == "call_1"
    assert final.stop_reason == "tool_use"
    m = client.messages.create(model=MODEL, max_tokens=64, messages=USER, tools=TOOLS, tool_choice={"type": "any"})
    assert m.content[1].input == {"city": "Paris"} and m.stop_reason == "tool_use"
    sent = backend.requests[-1]
    assert sent.tool_choice == "required" and sent.tools[0]["function"]["parameters"] == {"type": "object"}


def test_a_call_cut_by_max_tokens_is_left_out(live):
    backend, _, client = live
    backend.script = [ToolCallArguments("call_1", "get_weather", '{"ci'), Done("length"), Usage(1, 2)]
    with client.messages.stream(model=MODEL, max_tokens=2, messages=USER, tools=TOOLS) as stream:
        final = stream.get_final_message()
    assert final.content == [] and final.stop_reason == "max_tokens"


def test_tool_use_and_tool_result_blocks_in_the_conversation(live):
    backend, _, client = live
    client.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
    )
    sent = backend.requests[-1]
    assert [m.role for m in sent.messages] == ["user", "assistant", "tool", "user"]
    assert sent.messages[1].tool_calls[0].arguments == '{"city": "Paris"}'
    assert sent.messages[2].tool_call_id == "toolu_1" and sent.messages[2].text == "sunny"
    assert sent.tool_choice == "required" and not sent.parallel_tool_calls


def test_output_config_format_is_a_json_schema_constraint(live):
    backend, _, client = live
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    client.messages.create(
        model=MODEL, max_tokens=8, messages=USER, output_config={"format": {"type": "json_schema", "schema": schema}}
    )
    constraint = backend.requests[-1].sampling.constraint
    assert constraint.kind == "json" and json.loads(constraint.spec) == schema
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=8, messages=USER, output_config={"effort": "high"})


def test_image_blocks(live):
    backend, _, client = live
    data = base64.b64encode(png()).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    client.messages.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]
    )
    part = backend.requests[-1].messages[0].parts[0]
    assert isinstance(part, ImagePart) and part.data == png()


def _post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": "sk-test", **headers})


def test_errors_come_in_anthropics_shape(live):
    backend, url, client = live
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=8, messages=USER, extra_body={"temperature": 1.5})
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "invalid_request_error"
    r = _post(url, {"model": MODEL, "messages": USER})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = _post(url, {"model": "other", "max_tokens": 8, "messages": USER})
    assert r.status_code == 404 and r.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": r.json()["error"]["message"]},
    }
    r = httpx.post(f"{url}/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": USER})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = _post(url, {"model": MODEL, "max_tokens": 8, "messages": USER}, **{"x-api-key": "wrong"})
    assert r.status_code == 401
    backend.script = overloaded()
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert caught.value.status_code == 503 and caught.value.body["error"]["type"] == "overloaded_error"


def test_the_x_api_key_header_opens_the_openai_routes_too(live):
    _, url, _ = live
    r = httpx.post(
        f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER}, headers={"x-api-key": "sk-test"}
    )
    assert r.status_code == 200


def test_a_stop_sequence_that_ended_the_answer_is_named_streamed_or_not(live):
    backend, _, client = live
    backend.script = [
        TextDelta("One, two"),
        Done("stop", stop_sequence="three"),
        Usage(input_tokens=4, output_tokens=3),
    ]
    m = client.messages.create(model=MODEL, max_tokens=64, messages=USER, stop_sequences=["three"])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "three")
    with client.messages.stream(model=MODEL, max_tokens=64, messages=USER, stop_sequences=["three"]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "three")
    backend.script = [TextDelta("One"), Done("stop"), Usage(input_tokens=4, output_tokens=1)]
    plain = client.messages.create(model=MODEL, max_tokens=64, messages=USER, stop_sequences=["three"])
    assert (plain.stop_reason, plain.stop_sequence) == ("end_turn", None)
