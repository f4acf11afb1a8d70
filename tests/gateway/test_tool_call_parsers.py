"""``--tool-call-parser``: a tiny random Llama (CPU, temperature 1) whose chat template calls tools as each
family does, served with that family's parser. Forced calls are written in the family's own format, follow
their tool's parameters and end; the chat API turns them into OpenAI tool calls, streamed or whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from omni_gateway.omni.tools import tool_call_format

from tests.harness.live_server import serve
from tests.harness.real_engine import tiny_pipeline
from tests.harness.tool_templates import TEMPLATES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

USER = [{"role": "user", "content": "hi there"}]
ZONE = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}, "hours": {"type": "integer", "maximum": 9}},
    "required": ["zone", "hours"],
    "additionalProperties": False,
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": ZONE}}
DATE = {"type": "function", "function": {"name": "get_date", "parameters": {"type": "object", "properties": {}}}}
# How each family's forced answer opens (Mistral's is the bare list: its marker is a special token).
OPENING = {"hermes": '<tool_call>\n{"name": "', "llama3_json": '{"name": "', "mistral": '[{"name": "'}


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    name = request.param
    directory = tmp_path_factory.mktemp(f"tiny-{name}")
    pipe = tiny_pipeline(
        directory,
        max_tokens=120,
        chat_template=TEMPLATES[name],
        omni_args={"tool_call_parser": name},
    )
    pipe.checkpoint = directory
    yield name, pipe
    pipe.shutdown()


@pytest.fixture(scope="module")
def client(family: tuple[str, Any]) -> Iterator[tuple[str, str, openai.OpenAI]]:
    name, pipe = family
    with serve(pipe) as port:
        url = f"http://127.0.0.1:{port}"
        yield name, url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_forced_calls_are_written_in_the_family_format_and_end(family: tuple[str, Any]) -> None:
    from omni_gateway.engine import LLM, SamplingParams
    from omni_gateway.omni.prompting import structured_outputs
    from omni_gateway.omni.protocol import Message, OmniRequest, TextPart

    from tests.harness.real_engine import MAX_MODEL_LEN

    name, pipe = family
    fmt = tool_call_format(name)
    # An engine of its own on the same checkpoint: the pipeline's is driven by its own loop thread.
    llm = LLM(model=str(pipe.checkpoint), device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN)
    request = OmniRequest(
        "r", (Message("user", (TextPart("hi"),)),), tools=(TIME,), tool_choice="required", parallel_tool_calls=False
    )
    prompt = pipe.engine.render_chat(USER, tools=[TIME])
    params = SamplingParams(temperature=1.0, max_tokens=120, structured_outputs=structured_outputs(request, fmt))
    for out in llm.generate([prompt] * 8, params):
        text = out.outputs[0].text
        assert text.startswith(OPENING[name]) and out.outputs[0].finish_reason == "stop", text
        content, calls = fmt.parse(text, frozenset({"get_time"}))
        assert content == "" and len(calls) == 1, text
        jsonschema.validate(json.loads(calls[0].arguments), ZONE)


def test_a_named_choice_is_one_complete_call(client: tuple[str, str, openai.OpenAI]) -> None:
    _, _, api = client
    r = api.chat.completions.create(
        model="tiny-llama",
        messages=USER,  # type: ignore[arg-type]
        tools=[TIME, DATE],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        n=4,
    )
    for choice in r.choices:
        calls = choice.message.tool_calls or []
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        assert [c.function.name for c in calls] == ["get_time"]  # type: ignore[union-attr]
        jsonschema.validate(json.loads(calls[0].function.arguments), ZONE)  # type: ignore[union-attr]


def test_required_calls_stream_complete_and_valid(client: tuple[str, str, openai.OpenAI]) -> None:
    _, _, api = client
    chunks = list(
        api.chat.completions.create(
            model="tiny-llama",
            messages=USER,  # type: ignore[arg-type]
            tools=[TIME],  # type: ignore[list-item]
            tool_choice="required",
            stream=True,
        )
    )
    calls: dict[int, str] = {}
    for chunk in chunks:
        assert not (chunk.choices and chunk.choices[0].delta.content)  # no markup as content
        for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            calls[d.index] = calls.get(d.index, "") + (d.function.arguments or "")
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    # Parallel calls may go on until max_tokens: then only the call it was cut in is incomplete.
    complete = list(calls.values())[:-1] if finish == "length" else list(calls.values())
    assert calls and finish in ("tool_calls", "length")
    for arguments in complete:
        jsonschema.validate(json.loads(arguments), ZONE)


def test_earlier_calls_and_their_results_go_back_through_the_template(client: tuple[str, str, openai.OpenAI]) -> None:
    _, _, api = client
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    r = api.chat.completions.create(
        model="tiny-llama",
        messages=messages,  # type: ignore[arg-type]
        tools=[TIME],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls or []] == ["get_time"]  # type: ignore[union-attr]


def test_auto_choice_needs_enable_auto_tool_choice_once_a_parser_is_named(
    client: tuple[str, str, openai.OpenAI],
) -> None:
    _, url, _ = client
    body = {"model": "tiny-llama", "messages": USER, "tools": [TIME]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
    assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/chat/completions", json={**body, "tool_choice": "none"})
    assert r.status_code == 200, r.text


def test_a_realtime_session_that_requires_a_call_gets_one_complete_call_a_response(
    client: tuple[str, str, openai.OpenAI],
) -> None:
    """Realtime responses take parallel_tool_calls false: tool_choice "required" is one call, whose
    arguments are done (complete and valid) before its item and the response complete."""
    from websockets.sync.client import connect

    _, url, _ = client
    time_tool = {"type": "function", "name": "get_time", "parameters": ZONE}
    with connect(url.replace("http", "ws", 1) + "/v1/realtime") as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        session = {"type": "realtime", "output_modalities": ["text"], "tools": [time_tool], "tool_choice": "required"}
        ws.send(json.dumps({"type": "session.update", "session": session}))
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "time?"}]}
        ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        for turn in range(2):  # the tiny model's 256-token window holds two turns of calls
            ws.send(json.dumps({"type": "response.create"}))
            events = []
            while not events or events[-1]["type"] != "response.done":
                events.append(json.loads(ws.recv(timeout=120)))
                assert events[-1]["type"] != "error", events[-1]
            done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
            response = events[-1]["response"]
            assert len(done) == 1 and response["status"] == "completed", (turn, response)
            assert [o["type"] for o in response["output"]] == ["function_call"]
            jsonschema.validate(json.loads(done[0]["arguments"]), ZONE)
