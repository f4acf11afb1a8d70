"""Realtime function calls: tool_choice reaches the request, and a call's arguments stream as
response.function_call_arguments.delta events before .done."""

from __future__ import annotations

from typing import Any

import pytest
from omni_gateway.omni.protocol import Done, TextDelta, ToolCallArguments, ToolCallDelta

from tests.harness.session_driver import Driver, events, only, started, types

TOOLS = [
    {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}},
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}},
]


def _session(tool_choice: Any) -> tuple[Driver, str]:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "output_modalities": ["text"], "tools": TOOLS, "tool_choice": tool_choice},
        }
    )
    d.text_item("what time is it?")
    return d, started(d.send({"type": "response.create"}))


@pytest.mark.parametrize(
    ("tool_choice", "names", "required"),
    [
        ("auto", ["get_time", "get_weather"], "auto"),
        ("required", ["get_time", "get_weather"], "required"),
        ({"type": "function", "name": "get_weather"}, ["get_weather"], "required"),
        ("none", [], "auto"),
    ],
)
def test_tool_choice_reaches_the_request(tool_choice: Any, names: list[str], required: str) -> None:
    d, rid = _session(tool_choice)
    request = d.session.build_request(rid)
    assert request is not None
    assert ([t["name"] for t in request.tools], request.tool_choice) == (names, required)
    assert request.parallel_tool_calls is False  # the realtime API's only setting: one call a response


def test_arguments_stream_as_deltas_then_done() -> None:
    d, rid = _session("auto")
    pieces = ['{"zone"', ': "UTC"}']
    out = d.run(
        rid,
        [
            TextDelta("Let me check."),
            ToolCallArguments("call_1", "get_time", ""),
            *[ToolCallArguments("call_1", "get_time", p) for p in pieces],
            ToolCallDelta("call_1", "get_time", "".join(pieces)),
            Done("tool_calls"),
        ],
    )
    calls = [e for e in events(out) if e["type"].startswith("response.function_call_arguments")]
    assert [e.get("delta") for e in calls] == [*pieces, None]
    assert calls[-1]["arguments"] == "".join(pieces) and calls[-1]["name"] == "get_time"
    assert len({e["item_id"] for e in calls}) == 1
    order = types(out)
    # The text message closes before the call's item opens; the call's item closes after .done.
    assert order.index("response.output_text.done") < order.index("response.function_call_arguments.delta")
    assert order.index("response.function_call_arguments.done") < order.index("response.done")
    item = [e for e in events(out) if e["type"] == "response.output_item.done"][-1]["item"]
    assert (item["type"], item["call_id"], item["arguments"], item["status"]) == (
        "function_call",
        "call_1",
        "".join(pieces),
        "completed",
    )
    assert only(out, "response.done")["response"]["output"][-1]["arguments"] == "".join(pieces)


def test_a_call_cut_off_mid_arguments_is_incomplete() -> None:
    d, rid = _session("required")
    out = d.run(rid, [ToolCallArguments("call_1", "get_time", '{"zo'), Done("length")])
    item = only(out, "response.output_item.done")["item"]
    assert (item["type"], item["arguments"], item["status"]) == ("function_call", '{"zo', "incomplete")
