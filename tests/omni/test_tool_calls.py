"""Tool calls in generated text: the incremental parser that streams content and argument pieces, and
the structural tag that makes a model's calls follow their tools' parameters."""

from __future__ import annotations

import json
import random

import pytest
from omni_gateway.omni.tool_calls import ArgumentsDelta, CallEnd, CallStart, ToolCallStream, tool_call_tag

NAMES = frozenset({"get_weather", "get_time"})
TWO_CALLS = (
    'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "q": {"a": "}\\n</tool_call>"}}}'
    '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)


def _stream(text: str, seed: int) -> list[object]:
    """Events of ``text`` fed in random pieces of 1 to 6 characters."""
    rng = random.Random(seed)
    parser = ToolCallStream(NAMES)
    events: list[object] = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 6)
        events += parser.feed(text[i : i + n])
        i += n
    return events + parser.finish()


def _content(events: list[object]) -> str:
    return "".join(e for e in events if isinstance(e, str))


@pytest.mark.parametrize("seed", range(12))
def test_calls_stream_their_arguments_however_the_text_is_cut(seed: int) -> None:
    events = _stream(TWO_CALLS, seed)
    assert _content(events) == "Sure. "
    ends = [e.call for e in events if isinstance(e, CallEnd)]
    assert [(c.name, json.loads(c.arguments)) for c in ends] == [
        ("get_weather", {"city": "Paris", "q": {"a": "}\n</tool_call>"}}),
        ("get_time", {}),
    ]
    for call in ends:
        pieces = [e.delta for e in events if isinstance(e, ArgumentsDelta) and e.call_id == call.call_id]
        assert "".join(pieces) == call.arguments
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [s.call_id for s in starts] == [c.call_id for c in ends]
    # Each call starts before its first argument piece and ends after its last.
    for call in ends:
        positions = [i for i, e in enumerate(events) if getattr(e, "call_id", None) == call.call_id]
        assert isinstance(events[positions[0]], CallStart) and positions[-1] < events.index(CallEnd(call))


@pytest.mark.parametrize(
    "text",
    [
        "no calls here, a < sign and a <tool",
        '<tool_call>{"name": "unknown", "arguments": {}}</tool_call> after',
        "<tool_call> not json </tool_call>",
    ],
)
def test_text_that_is_no_call_of_ours_stays_content(text: str) -> None:
    for seed in range(4):
        events = _stream(text, seed)
        assert _content(events) == text and not [e for e in events if not isinstance(e, str)]


def test_a_bare_json_call_is_parsed_at_the_end() -> None:
    events = _stream('{"name": "get_time", "parameters": {"zone": "UTC"}}', 0)
    [end] = [e for e in events if isinstance(e, CallEnd)]
    assert (end.call.name, json.loads(end.call.arguments)) == ("get_time", {"zone": "UTC"})


def test_a_call_cut_off_streams_its_pieces_but_never_ends() -> None:
    parser = ToolCallStream(NAMES)
    events = parser.feed('<tool_call>\n{"name": "get_time", "arguments": {"zo') + parser.finish()
    assert isinstance(events[0], CallStart)
    assert "".join(e.delta for e in events if isinstance(e, ArgumentsDelta)) == '{"zo'
    assert not [e for e in events if isinstance(e, CallEnd)] and parser.calls == []


@pytest.mark.parametrize(("required", "parallel"), [(True, True), (True, False), (False, True), (False, False)])
def test_tool_call_tag_compiles_and_follows_the_parameters(required: bool, parallel: bool) -> None:
    xgr = pytest.importorskip("xgrammar")
    from tests.harness.checkpoints import VOCAB, byte_level_tokenizer

    tools = [
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "name": "get_weather", "parameters": {"enum": [1, 2]}},  # the realtime shape
    ]
    tag = tool_call_tag(tools, required=required, parallel=parallel)
    tokenizer = byte_level_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB, stop_token_ids=[tokenizer.eos_token_id])
    compiled = xgr.GrammarCompiler(info).compile_structural_tag(json.dumps(tag))

    one = '<tool_call>\n{"name": "get_weather", "arguments": 2}\n</tool_call>'
    two = one + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert xgr.GrammarMatcher(compiled).accept_string(one)
    assert xgr.GrammarMatcher(compiled).accept_string(two) == parallel
    assert not xgr.GrammarMatcher(compiled).accept_string('<tool_call>\n{"name": "get_weather", "arguments": 3')
    assert xgr.GrammarMatcher(compiled).accept_string("plain text") == (not required)
    complete = xgr.GrammarMatcher(compiled)
    assert complete.accept_string(one) and complete.accept_token(tokenizer.eos_token_id) and complete.is_terminated()


def test_a_raw_tab_in_an_argument_string_still_gives_strict_json() -> None:
    from omni_gateway.omni.tool_calls import parse_tool_calls

    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Los\tAngeles"}}\n</tool_call>'  # a raw tab
    content, calls = parse_tool_calls(text, frozenset({"get_weather"}))
    assert content == "" and len(calls) == 1
    assert json.loads(calls[0].arguments) == {"city": "Los\tAngeles"}  # strict parse: the tab is escaped
