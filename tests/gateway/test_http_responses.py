"""/v1/responses through the official openai SDK (typed objects and events) against a live server."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import openai
import pytest
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.omni.protocol import AudioPart, Done, ImagePart, TextDelta, ToolCallArguments, ToolCallDelta, Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from tests.gateway.test_http_parsing import wav_bytes
from tests.harness.fake_backend import FakeBackend, png
from tests.harness.live_server import served

MODEL = "omni-test"
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}]


def test_create_with_a_string_input_and_instructions(fake):
    backend, _, client = fake
    r = client.responses.create(
        model=MODEL, input="hi there", instructions="Be brief.", temperature=0.5, top_p=0.9, max_output_tokens=64
    )
    assert isinstance(r, Response)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "hello from the fake model"
    (message,) = r.output
    assert isinstance(message, ResponseOutputMessage) and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.status == "completed"
    assert r.usage.output_tokens == 5 and r.usage.input_tokens == 4 and r.usage.total_tokens == 9
    assert (r.instructions, r.temperature, r.top_p, r.max_output_tokens) == ("Be brief.", 0.5, 0.9, 64)
    sent = backend.requests[-1]
    assert [(m.role, m.text) for m in sent.messages] == [("system", "Be brief."), ("user", "hi there")]
    assert (sent.sampling.temperature, sent.sampling.top_p, sent.sampling.max_tokens) == (0.5, 0.9, 64)
    assert sent.request_id == r.id


def test_max_output_tokens_makes_an_incomplete_response(fake):
    _, _, client = fake
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "hello from" and r.output[0].status == "incomplete"


def test_streamed_events_follow_the_responses_sequence(fake):
    _, _, client = fake
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    kinds = [type(e) for e in events]
    assert kinds[:5] == [
        ResponseCreatedEvent,
        ResponseInProgressEvent,
        ResponseOutputItemAddedEvent,
        ResponseContentPartAddedEvent,
        ResponseTextDeltaEvent,
    ]
    assert kinds[-4:] == [
        ResponseTextDoneEvent,
        ResponseContentPartDoneEvent,
        ResponseOutputItemDoneEvent,
        ResponseCompletedEvent,
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    text = "".join(e.delta for e in deltas)
    assert text == "hello from the fake model" and events[-4].text == text
    item_id = events[2].item.id
    assert all(e.item_id == item_id and e.output_index == 0 and e.content_index == 0 for e in deltas)
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    assert final.status == "completed" and final.output_text == text and final.usage.output_tokens == 5


def test_the_sdk_stream_helper_assembles_the_final_response(fake):
    _, _, client = fake
    with client.responses.stream(model=MODEL, input="hi") as stream:
        seen = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.output_text.delta" in seen and seen[-1] == "response.completed"
    assert final.output_text == "hello from the fake model"


def test_function_calls_and_their_outputs_on_the_next_turn(fake):
    backend, _, client = fake
    backend.script = [
        TextDelta("Let me check."),
        ToolCallArguments("call_1", "get_weather", '{"city": '),
        ToolCallArguments("call_1", "get_weather", '"Paris"}'),
        ToolCallDelta("call_1", "get_weather", '{"city": "Paris"}'),
        Done("stop"),
        Usage(input_tokens=5, output_tokens=9),
    ]
    events = list(client.responses.create(model=MODEL, input="weather?", tools=TOOLS, stream=True))
    added = [e for e in events if isinstance(e, ResponseOutputItemAddedEvent)]
    assert [e.item.type for e in added] == ["message", "function_call"] and added[1].output_index == 1
    pieces = [e.delta for e in events if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent)]
    assert pieces == ['{"city": ', '"Paris"}']
    (done,) = [e for e in events if isinstance(e, ResponseFunctionCallArgumentsDoneEvent)]
    assert json.loads(done.arguments) == {"city": "Paris"}
    # the message closes before the call opens
    names = [e.type for e in events]
    assert names.index("response.output_item.done") < names.index("response.function_call_arguments.delta")
    final = events[-1].response
    call = final.output[1]
    assert isinstance(call, ResponseFunctionToolCall) and call.call_id == "call_1" and call.status == "completed"
    assert backend.requests[-1].tools[0]["function"]["name"] == "get_weather"

    backend.script = None
    r = client.responses.create(
        model=MODEL,
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
    )
    assert r.previous_response_id == final.id and r.output_text == "hello from the fake model"
    messages = backend.requests[-1].messages
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[1].text == "Let me check." and messages[1].tool_calls[0].arguments == '{"city": "Paris"}'
    assert messages[2].tool_call_id == "call_1" and messages[2].text == "sunny"


def test_function_call_items_sent_back_as_input(fake):
    backend, _, client = fake
    client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        ],
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
    )
    sent = backend.requests[-1]
    assert [m.role for m in sent.messages] == ["user", "assistant", "tool", "tool"]
    assert [c.call_id for c in sent.messages[1].tool_calls] == ["c1", "c2"]
    assert sent.messages[3].text == "rain" and sent.tool_choice == "required"


def test_a_call_cut_by_the_token_limit_ends_incomplete_without_arguments_done(fake):
    backend, _, client = fake
    backend.script = [ToolCallArguments("call_1", "get_weather", '{"ci'), Done("length"), Usage(1, 2)]
    events = list(client.responses.create(model=MODEL, input="weather?", tools=TOOLS, stream=True))
    assert not any(isinstance(e, ResponseFunctionCallArgumentsDoneEvent) for e in events)
    assert isinstance(events[-1], ResponseIncompleteEvent)
    assert events[-1].response.output[0].status == "incomplete"
    assert events[-2].item.status == "incomplete"


def test_structured_output_formats_become_constraints(fake):
    backend, _, client = fake
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = client.responses.create(
        model=MODEL,
        input="json please",
        text={"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}},
    )
    constraint = backend.requests[-1].sampling.constraint
    assert constraint.kind == "json" and json.loads(constraint.spec) == schema
    assert r.text.format.type == "json_schema" and r.text.format.name == "thing"
    client.responses.create(model=MODEL, input="json please", text={"format": {"type": "json_object"}})
    assert backend.requests[-1].sampling.constraint.kind == "json_object"


def test_reasoning_is_refused_unless_none(fake):
    _, _, client = fake
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="hi", reasoning={"effort": "high"})
    assert caught.value.body["param"] == "reasoning.effort" and "does not reason" in caught.value.body["message"]
    assert client.responses.create(model=MODEL, input="hi", reasoning={"effort": "none"}).status == "completed"


def test_builtin_tools_are_refused(fake):
    _, _, client = fake
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}])
    assert caught.value.body["param"] == "tools[0].type"


def test_retrieve_delete_and_store_false(fake):
    _, _, client = fake
    r = client.responses.create(model=MODEL, input="hi")
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model=MODEL, input="hi", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="again", previous_response_id=unstored.id)
    error = caught.value.body
    assert error["param"] == "previous_response_id" and error["type"] == "invalid_request_error"
    assert error["code"] == "previous_response_not_found"


def test_the_store_keeps_a_bounded_count():
    with served(FakeBackend(), GatewayConfig(max_stored_responses=2)) as (_, client):
        ids = [client.responses.create(model=MODEL, input="hi").id for _ in range(3)]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[0])
        assert client.responses.retrieve(ids[2]).id == ids[2]


def test_image_and_audio_input_parts(fake):
    backend, _, client = fake
    image = "data:image/png;base64," + base64.b64encode(png()).decode()
    audio = base64.b64encode(wav_bytes([0, 100, -100] * 80)).decode()
    client.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this"},
                    {"type": "input_image", "image_url": image, "detail": "low"},
                    {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
                    {"type": "input_file", "file_data": "data:audio/wav;base64," + audio, "filename": "a.wav"},
                ],
            }
        ],
    )
    parts = backend.requests[-1].messages[0].parts
    assert isinstance(parts[1], ImagePart) and parts[1].data == png() and parts[1].detail == "low"
    assert isinstance(parts[2], AudioPart) and isinstance(parts[3], AudioPart) and parts[2].pcm16 == parts[3].pcm16


def test_media_the_model_cannot_take_is_a_clear_400():
    with served(FakeBackend(vision=False)) as (_, client):
        image = "data:image/png;base64," + base64.b64encode(png()).decode()
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(
                model=MODEL,
                input=[{"role": "user", "content": [{"type": "input_image", "image_url": image, "detail": "auto"}]}],
            )
        assert caught.value.body["param"] == "input[0].content[0].image_url" and "image" in str(caught.value)
        with pytest.raises(openai.BadRequestError) as caught:
            pdf = "data:application/pdf;base64,JVBERg=="
            client.responses.create(
                model=MODEL, input=[{"role": "user", "content": [{"type": "input_file", "file_data": pdf}]}]
            )
        assert caught.value.body["param"] == "input[0].content[0].file_data"


def test_chat_errors_name_the_responses_field(fake):
    _, url, _ = fake
    r = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": [{"role": "user", "content": ""}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content"
    r = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "hi", "temperature": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(f"{url}/v1/responses", json={"model": "other", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_a_streamed_response_is_stored_and_continued_without_its_instructions(fake):
    backend, _, client = fake
    with client.responses.stream(model=MODEL, input="first", instructions="Be brief.") as stream:
        first = stream.get_final_response()
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.create(model=MODEL, input="second", previous_response_id=first.id, instructions="Be kind.")
    sent = backend.requests[-1].messages
    assert [(m.role, m.text) for m in sent] == [
        ("system", "Be kind."),
        ("user", "first"),
        ("assistant", "hello from the fake model"),
        ("user", "second"),
    ]


def test_an_openai_agents_tool_loop_runs_over_responses(fake, monkeypatch):
    """The Agents SDK's default model speaks the Responses API: a call, its output, then the answer."""
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    backend, url, _ = fake
    scripts = iter(
        [
            [ToolCallDelta("call_1", "get_weather", '{"city": "Paris"}'), Done("stop"), Usage(3, 4)],
            [TextDelta("It is sunny."), Done("stop"), Usage(5, 3)],
        ]
    )
    monkeypatch.setattr(backend, "chunks", lambda request: next(scripts))

    @function_tool
    def get_weather(city: str) -> str:
        return f"sunny in {city}"

    async def run() -> Any:
        set_tracing_disabled(True)
        model = OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(base_url=f"{url}/v1", api_key="x"))
        agent = Agent(name="weather", instructions="Be brief.", model=model, tools=[get_weather])
        return await Runner.run(agent, "weather in Paris?")

    result = asyncio.run(run())
    assert result.final_output == "It is sunny."
    messages = backend.requests[-1].messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[-1].text == "sunny in Paris" and messages[-1].tool_call_id == "call_1"
