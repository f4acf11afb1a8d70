"""Hostile output constraints against the live server over a real engine (tiny random Llama, CPU): limits,
constraints nothing satisfies and the compile budget are 400s that name what was wrong, in our words;
over realtime an ``error`` event, and the session goes on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.harness.live_server import serve
from tests.harness.real_engine import tiny_pipeline

pytestmark = pytest.mark.slow
USER = [{"role": "user", "content": "hi there"}]
TIMEOUT = 60


def nested_any_of(depth: int) -> str:
    head = '{"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": '
    return head * depth + '{"type": "integer"}' + "}}]}" * depth


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pipe = tiny_pipeline(Path(tmp_path_factory.mktemp("tiny-llama")), max_tokens=60)
    with serve(pipe) as port:
        yield f"127.0.0.1:{port}"
    pipe.shutdown()


def chat(url: str, **fields: Any) -> httpx.Response:
    body = {"model": "tiny-llama", "messages": USER, "max_tokens": 16, **fields}
    return httpx.post(f"http://{url}/v1/chat/completions", json=body, timeout=TIMEOUT)


def schema_format(schema: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


@pytest.mark.parametrize(
    ("fields", "param", "said"),
    [
        (schema_format(json.loads(nested_any_of(40))), "response_format.json_schema.schema", "more than 64 deep"),
        (schema_format({"enum": [str(i) for i in range(1100)]}), "response_format.json_schema.schema", "1024"),
        ({"structured_outputs": {"regex": "a{1000}{1000}"}}, "structured_outputs.regex", "repeats 1,000,000 times"),
        ({"guided_regex": "a{2}{2}"}, "guided_regex", "Two consecutive repetition modifiers are not allowed"),
        ({"structured_outputs": {"grammar": "root ::= root"}}, "structured_outputs.grammar", "matches no output"),
        (
            {"structured_outputs": {"grammar": "root ::= a\na ::= b\nb ::= a"}},
            "structured_outputs.grammar",
            "no output",
        ),
        (
            schema_format({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}),
            "response_format.json_schema.schema",
            "no finite answer",
        ),
        (
            schema_format({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}),
            "response_format.json_schema.schema",
            "no finite answer",
        ),
        (schema_format({"type": "string", "minLength": 5000}), "response_format.json_schema.schema", "max_tokens"),
    ],
)
def test_hostile_constraints_are_400s_naming_the_field(url: str, fields: dict[str, Any], param: str, said: str) -> None:
    r = chat(url, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and said in error["message"], error
    assert "/project/" not in error["message"] and not error["message"].count("[") > 2  # no library log prefix
    assert chat(url, response_format={"type": "json_object"}).status_code == 200  # the server goes on


def test_streamed_requests_are_refused_before_the_stream(url: str) -> None:
    r = chat(url, stream=True, structured_outputs={"grammar": "root ::= root"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs.grammar"


def test_over_realtime_a_hostile_tool_schema_is_an_error_event_and_the_session_goes_on(url: str) -> None:
    deep = json.loads(nested_any_of(40))
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": deep}}}

    async def go() -> tuple[dict[str, Any], str]:
        async with connect(f"ws://{url}/v1/realtime") as ws:
            await until(ws, "session.created")
            settings = {
                "instructions": "Call f.",
                "output_modalities": ["text"],
                "tools": [tool],
                "tool_choice": "required",
            }
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", **settings}}))
            await until(ws, "session.updated")
            await ws.send(json.dumps({"type": "response.create"}))
            error = await until(ws, "error")
            await until(ws, "response.done")
            plain = {"tools": [], "tool_choice": "auto", "max_output_tokens": 8}
            await ws.send(json.dumps({"type": "response.create", "response": plain}))
            done = await until(ws, "response.done")
            return error, done["response"]["status"]

    error, status = asyncio.run(asyncio.wait_for(go(), TIMEOUT))
    assert "more than 64 deep" in error["error"]["message"], error
    assert status in ("completed", "incomplete")  # it generated: the session went on


async def until(ws: Any, kind: str) -> dict[str, Any]:
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == kind:
            return event


def test_a_compile_past_the_budget_is_a_400_in_our_words(tmp_path: Path) -> None:
    pipe = tiny_pipeline(tmp_path, max_tokens=16, structured_outputs_compile_timeout=0.001)
    try:
        with serve(pipe) as port:
            r = chat(f"127.0.0.1:{port}", **schema_format(json.loads(nested_any_of(15))))
    finally:
        pipe.shutdown()
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "did not compile within 0.001 s" in message and "--structured-outputs-compile-timeout" in message


def test_a_constraint_failing_mid_answer_raises_in_the_openai_sdk() -> None:
    # What the engine's error delta becomes (omni.streams): an Error chunk after some text.
    import openai
    from omni_gateway.omni.protocol import Error, TextDelta

    from tests.harness.fake_backend import FakeBackend

    script = [TextDelta('{"a": '), Error("engine_error", "the output constraint allowed no next token", status=500)]
    with serve(FakeBackend(script=script)) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="omni-test", messages=USER)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError):
            for _ in client.chat.completions.create(model="omni-test", messages=USER, stream=True):  # type: ignore[arg-type]
                pass
