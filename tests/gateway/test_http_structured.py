"""Structured outputs and forced tool calls over HTTP: what the request fields become (scripted backend)
and what a real engine (tiny random Llama, CPU, temperature 1) answers under them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from omni_gateway.omni.protocol import Done, OutputConstraint, ToolCallArguments, ToolCallDelta, Usage

from tests.harness.live_server import serve
from tests.harness.real_engine import tiny_pipeline

USER = [{"role": "user", "content": "hi there"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
CANONICAL = json.dumps(SCHEMA)


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/{path}", json={"model": "omni-test", **body}, timeout=20)


# ---- what the fields become (scripted backend) --------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "w", "schema": SCHEMA, "strict": True},
                }
            },
            OutputConstraint("json", CANONICAL, param="response_format.json_schema.schema"),
        ),
        ({"response_format": {"type": "json_object"}}, OutputConstraint("json_object", param="response_format")),
        ({"response_format": {"type": "text"}}, None),
        (
            {"structured_outputs": {"json": SCHEMA}},
            OutputConstraint("json", CANONICAL, param="structured_outputs.json"),
        ),
        (
            {"structured_outputs": {"choice": ["yes", "no"]}},
            OutputConstraint("choice", choices=("yes", "no"), param="structured_outputs.choice"),
        ),
        ({"guided_regex": r"\d+"}, OutputConstraint("regex", r"\d+", param="guided_regex")),
        ({"guided_json": json.dumps(SCHEMA)}, OutputConstraint("json", CANONICAL, param="guided_json")),
        (
            {"structured_outputs": {"grammar": 'root ::= "a"'}},
            OutputConstraint("grammar", 'root ::= "a"', param="structured_outputs.grammar"),
        ),
    ],
)
def test_chat_constraint_fields_reach_the_backend(fake: Any, fields: dict[str, Any], expected: Any) -> None:
    backend, url, _ = fake
    r = _post(url, "chat/completions", {"messages": USER, **fields})
    assert r.status_code == 200, r.text
    assert backend.requests[-1].sampling.constraint == expected


def test_completions_take_structured_outputs(fake: Any) -> None:
    backend, url, _ = fake
    r = _post(url, "completions", {"prompt": "x", "structured_outputs": {"regex": "[ab]+"}})
    assert r.status_code == 200, r.text
    assert backend.requests[-1].sampling.constraint == OutputConstraint(
        "regex", "[ab]+", param="structured_outputs.regex"
    )
    r = _post(url, "completions", {"prompt": "x", "response_format": {"type": "json_object"}})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "response_format")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": [1]}}},
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex"),
        ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "tools[0].function.parameters"),
    ],
)
def test_malformed_constraints_are_400s_naming_the_field(fake: Any, fields: dict[str, Any], param: str) -> None:
    _, url, _ = fake
    r = _post(url, "chat/completions", {"messages": USER, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("tool_choice", "tools", "required"),
    [
        ("auto", [WEATHER, TIME], "auto"),
        ("required", [WEATHER, TIME], "required"),
        ({"type": "function", "function": {"name": "get_time"}}, [TIME], "required"),
        ("none", [], "auto"),
    ],
)
def test_tool_choice_reaches_the_backend(fake: Any, tool_choice: Any, tools: list[Any], required: str) -> None:
    backend, url, _ = fake
    body = {"messages": USER, "tools": [WEATHER, TIME], "tool_choice": tool_choice, "parallel_tool_calls": False}
    assert _post(url, "chat/completions", body).status_code == 200
    sent = backend.requests[-1]
    assert (list(sent.tools), sent.tool_choice, sent.parallel_tool_calls) == (tools, required, False)


@pytest.mark.parametrize(
    ("tool_choice", "parallel"),
    [("required", True), ("auto", True), ({"type": "function", "function": {"name": "get_time"}}, False)],
)
def test_only_a_named_choice_overrides_parallel_tool_calls(fake: Any, tool_choice: Any, parallel: bool) -> None:
    backend, url, _ = fake
    body = {"messages": USER, "tools": [WEATHER, TIME], "tool_choice": tool_choice, "parallel_tool_calls": True}
    assert _post(url, "chat/completions", body).status_code == 200
    assert backend.requests[-1].parallel_tool_calls is parallel  # a named function is called exactly once


def test_tool_call_arguments_stream_as_deltas(fake: Any) -> None:
    backend, _, client = fake
    pieces = ['{"city"', ': "Oslo", ', '"days": 2}']
    backend.script = [
        ToolCallArguments("call_1", "get_weather", ""),
        *[ToolCallArguments("call_1", "get_weather", p) for p in pieces],
        ToolCallDelta("call_1", "get_weather", "".join(pieces)),
        Done("tool_calls"),
        Usage(input_tokens=5, output_tokens=7),
    ]
    chunks = list(client.chat.completions.create(model="omni-test", messages=USER, tools=[WEATHER], stream=True))
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id == "call_1" and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 for d in deltas) and all(d.id is None for d in deltas[1:])
    assert [d.function.arguments for d in deltas[1:]] == pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    r = client.chat.completions.create(model="omni-test", messages=USER, tools=[WEATHER])
    assert [c.function.arguments for c in r.choices[0].message.tool_calls] == ["".join(pieces)]


# ---- a real engine under the constraints ------------------------------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, openai.OpenAI]]:
    pipe = tiny_pipeline(tmp_path_factory.mktemp("tiny-llama"), max_tokens=180)
    with serve(pipe) as port:
        url = f"http://127.0.0.1:{port}"
        yield url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    pipe.shutdown()


@pytest.mark.slow
def test_json_schema_answers_validate(real: tuple[str, openai.OpenAI]) -> None:
    _, client = real
    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="tiny-llama", messages=USER, response_format=fmt, n=3)  # type: ignore[arg-type]
    for choice in r.choices:
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


@pytest.mark.slow
def test_schema_the_compiler_rejects_is_a_400_naming_it(real: tuple[str, openai.OpenAI]) -> None:
    url, _ = real
    bad = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}}
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny-llama", "messages": USER, "response_format": fmt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny-llama", "prompt": "x", "guided_regex": "(a"})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "guided_regex")


@pytest.mark.slow
def test_completions_regex_and_choice(real: tuple[str, openai.OpenAI]) -> None:
    _, client = real
    r = client.completions.create(
        model="tiny-llama", prompt="hello", max_tokens=20, extra_body={"structured_outputs": {"regex": r"[0-9]{4}"}}
    )
    assert len(r.choices[0].text) == 4 and r.choices[0].text.isdigit()
    r = client.completions.create(model="tiny-llama", prompt="hello", extra_body={"guided_choice": ["left", "right"]})
    assert r.choices[0].text in ("left", "right")


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [True, False])
def test_required_tool_calls_validate_and_stream(real: tuple[str, openai.OpenAI], parallel: bool) -> None:
    _, client = real
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=USER,
            tools=[WEATHER, TIME],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=parallel,
            stream=True,
        )
    )
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or "" if d.id else ""
            call["arguments"] += d.function.arguments or ""
    finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    assert calls and (parallel or len(calls) == 1)
    # A random model may go on calling until max_tokens: only the call it was cut in may be incomplete.
    complete = list(calls.values())[:-1] if finish == "length" else list(calls.values())
    assert finish == "tool_calls" or (parallel and finish == "length")
    for call in complete:
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


@pytest.mark.slow
def test_named_tool_choice_calls_that_tool(real: tuple[str, openai.OpenAI]) -> None:
    _, client = real
    r = client.chat.completions.create(
        model="tiny-llama",
        messages=USER,
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    calls = r.choices[0].message.tool_calls or []
    assert calls and all(c.function.name == "get_time" for c in calls)  # type: ignore[union-attr]
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), TIME["function"]["parameters"])  # type: ignore[union-attr]
