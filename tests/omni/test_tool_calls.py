"""Tool calls in generated text, in each family's format: the incremental reader that streams content and
argument pieces (pure Python, no model), and the structural tag that makes a model's calls follow their
tools' parameters and end."""

from __future__ import annotations

import json
import random

import pytest
from omni_gateway.omni.tools import (
    TOOL_CALL_PARSERS,
    ArgumentsDelta,
    CallEnd,
    CallStart,
    tool_call_format,
)

NAMES = frozenset({"get_weather", "get_time"})
TRICKY = {"city": "Paris", "q": {"a": "}\n</tool_call>]};", "b": [1, {"c": "]"}]}}
# The same two calls in each family's format, with text before them where the format allows it.
TWO_CALLS = {
    "hermes": (
        "Sure. ",
        f'Sure. <tool_call>\n{{"name": "get_weather", "arguments": {json.dumps(TRICKY)}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    ),
    "llama3_json": (
        "",
        f'<|python_tag|>{{"name": "get_weather", "parameters": {json.dumps(TRICKY)}}}; '
        '{"name": "get_time", "parameters": {}}',
    ),
    "mistral": (
        "Sure. ",
        f'Sure. [TOOL_CALLS][{{"name": "get_weather", "arguments": {json.dumps(TRICKY)}}}, '
        '{"name": "get_time", "arguments": {}}]',
    ),
}


def _stream(fmt: str, text: str, seed: int, *, forced: bool = False) -> list[object]:
    """Events of ``text`` fed in random pieces of 1 to 6 characters."""
    rng = random.Random(seed)
    reader = tool_call_format(fmt).stream(NAMES, forced=forced)
    events: list[object] = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 6)
        events += reader.feed(text[i : i + n])
        i += n
    return events + reader.finish()


def _content(events: list[object]) -> str:
    return "".join(e for e in events if isinstance(e, str))


@pytest.mark.parametrize("fmt", sorted(TWO_CALLS))
@pytest.mark.parametrize("seed", range(8))
def test_calls_stream_their_arguments_however_the_text_is_cut(fmt: str, seed: int) -> None:
    content, text = TWO_CALLS[fmt]
    events = _stream(fmt, text, seed)
    assert _content(events) == content
    ends = [e.call for e in events if isinstance(e, CallEnd)]
    assert [(c.name, json.loads(c.arguments)) for c in ends] == [("get_weather", TRICKY), ("get_time", {})]
    for call in ends:
        pieces = [e.delta for e in events if isinstance(e, ArgumentsDelta) and e.call_id == call.call_id]
        assert "".join(pieces) == call.arguments
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [s.call_id for s in starts] == [c.call_id for c in ends]
    for call in ends:  # each call starts before its first argument piece and ends after its last
        positions = [i for i, e in enumerate(events) if getattr(e, "call_id", None) == call.call_id]
        assert isinstance(events[positions[0]], CallStart) and positions[-1] < events.index(CallEnd(call))


@pytest.mark.parametrize("fmt", sorted(TWO_CALLS))
def test_whole_answers_parse_as_the_stream_does(fmt: str) -> None:
    content, text = TWO_CALLS[fmt]
    parsed, calls = tool_call_format(fmt).parse(text, NAMES)
    assert parsed == content.strip() and [c.name for c in calls] == ["get_weather", "get_time"]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("hermes", "no calls here, a < sign and a <tool"),
        ("hermes", '<tool_call>{"name": "unknown", "arguments": {}}</tool_call> after'),
        ("hermes", "<tool_call> not json </tool_call>"),
        ("hermes", '<tool_call>{"name": "get_\\xtime", "arguments": {}}</tool_call>'),
        ("hermes", "\n  text, then <tool_call> not json"),
        ("mistral", "text, then [TOOL_CALLS] not json"),
        ("llama3_json", 'The object {"name": "get_time", "parameters": {}} is a call'),
        ("llama3_json", '{"name": "unknown", "parameters": {}}'),
        ("llama3_json", '{"city": "Paris"}'),
        ("mistral", "[1, 2] is a list"),
        ("mistral", '[TOOL_CALLS] [{"name": "unknown", "arguments": {}}]'),
    ],
)
def test_text_that_is_no_call_of_ours_stays_content(fmt: str, text: str) -> None:
    for seed in range(4):
        events = _stream(fmt, text, seed)
        assert _content(events) == text and not [e for e in events if not isinstance(e, str)]


def test_a_bare_json_call_reads_as_a_call_in_the_default_format() -> None:
    events = _stream("hermes", '{"name": "get_time", "parameters": {"zone": "UTC"}}', 0)
    [end] = [e for e in events if isinstance(e, CallEnd)]
    assert (end.call.name, json.loads(end.call.arguments)) == ("get_time", {"zone": "UTC"})


def test_mistral_calls_whose_marker_decoding_dropped_read_the_same() -> None:
    _, calls = tool_call_format("mistral").parse('[{"name": "get_time", "arguments": {"zone": "UTC"}}]', NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "UTC"})]


@pytest.mark.parametrize(
    ("fmt", "cut"),
    [
        ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"zo'),
        ("llama3_json", '{"name": "get_time", "parameters": {"zo'),
        ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zo'),
        ("mistral", '[{"name": "get_time", "arguments": {"zone": "UTC"}'),  # arguments whole, call object not
    ],
)
def test_a_call_cut_off_streams_its_pieces_but_never_ends(fmt: str, cut: str) -> None:
    reader = tool_call_format(fmt).stream(NAMES)
    events = reader.feed(cut) + reader.finish()
    assert isinstance(events[0], CallStart)
    assert cut.endswith("".join(e.delta for e in events if isinstance(e, ArgumentsDelta)))
    assert not [e for e in events if isinstance(e, CallEnd)] and reader.calls == []


@pytest.mark.parametrize(
    "cut",
    ["<tool_c", '<tool_call>\n{"na', '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_c'],
)
def test_no_markup_of_a_forced_answer_is_content(cut: str) -> None:
    events = _stream("hermes", cut, 0, forced=True)
    assert _content(events) == ""


@pytest.mark.parametrize(
    ("fmt", "cut"),
    [
        ("hermes", 'Let me look. <tool_call>\n{"name": "get_'),
        ("llama3_json", '{"name": "get_time", "param'),
        ("mistral", 'Let me look. [TOOL_CALLS][{"na'),
    ],
)
def test_a_call_cut_off_in_its_head_leaves_no_markup_in_content(fmt: str, cut: str) -> None:
    for seed in range(4):
        events = _stream(fmt, cut, seed)
        assert _content(events).strip() in ("", "Let me look.") and not [e for e in events if not isinstance(e, str)]


# A forced answer of several calls in each family's format: (opening, one call, separator, closing).
FORCED_CALLS = {
    "hermes": ("", '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>', "\n", ""),
    "llama3_json": ("", '{{"name": "{}", "parameters": {}}}', "; ", ""),
    "mistral": ("[", '{{"name": "{}", "arguments": {}}}', ", ", "]"),
}


def _forced_answer(fmt: str, *calls: tuple[str, str]) -> str:
    opening, call, separator, closing = FORCED_CALLS[fmt]
    return opening + separator.join(call.format(name, arguments) for name, arguments in calls) + closing


PARIS, LONDON = ("get_weather", '{"city": "Paris", "days": 2}'), ("get_weather", '{"city": "London", "days": 2}')


@pytest.mark.parametrize("fmt", sorted(FORCED_CALLS))
@pytest.mark.parametrize("seed", range(4))
def test_a_forced_call_repeating_an_earlier_one_ends_the_answer_unreported(fmt: str, seed: int) -> None:
    # The repeat is the first call again, its arguments written another way: equal as JSON all the same.
    again = ("get_weather", '{ "days": 2,"city":"Paris" }')
    text = _forced_answer(fmt, PARIS, LONDON, again, ("get_time", "{}"))
    rng = random.Random(seed)
    reader = tool_call_format(fmt).stream(NAMES, forced=True)
    events: list[object] = []
    i = 0
    while i < len(text) and not reader.ended:
        n = rng.randint(1, 6)
        events += reader.feed(text[i : i + n])
        i += n
    assert reader.ended and i < len(text)  # over as soon as the repeat closed, before the text ran out
    assert reader.feed('{"name": "get_time", "arguments": {}}') == [] and reader.finish() == []
    assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_weather", {"city": "London", "days": 2}),
    ]
    assert [e.call for e in events if isinstance(e, CallEnd)] == reader.calls and _content(events) == ""
    first, second = reader.calls
    assert len([e for e in events if getattr(e, "call_id", None) == first.call_id]) > 1  # the first streamed
    # The second was held until complete, then sent whole: its start, all its arguments in one piece, its end.
    start = events.index(CallStart(second.call_id, second.name))
    assert events[start:] == [
        CallStart(second.call_id, second.name),
        ArgumentsDelta(second.call_id, second.name, second.arguments),
        CallEnd(second),
    ]


@pytest.mark.parametrize("fmt", sorted(FORCED_CALLS))
def test_forced_calls_of_one_function_with_different_arguments_are_all_kept(fmt: str) -> None:
    tokyo = ("get_weather", '{"city": "Paris", "days": 3}')  # one argument differs from PARIS
    _, calls = tool_call_format(fmt).parse(_forced_answer(fmt, PARIS, LONDON, tokyo), NAMES, forced=True)
    assert [json.loads(c.arguments) for c in calls] == [json.loads(a) for _, a in (PARIS, LONDON, tokyo)]


def test_a_held_call_cut_off_by_max_tokens_goes_out_unfinished() -> None:
    whole = _forced_answer("hermes", PARIS, LONDON)
    text = whole[: whole.rindex('ys": 2')]  # the second call is cut inside its arguments
    reader = tool_call_format("hermes").stream(NAMES, forced=True)
    events = reader.feed(text)
    assert [e for e in events if isinstance(e, CallEnd)] == [CallEnd(reader.calls[0])]
    [start] = [e for e in events if isinstance(e, CallStart)]  # the held call is not out yet
    tail = reader.finish()
    assert isinstance(tail[0], CallStart) and tail[0].call_id != start.call_id
    assert tail[1:] == [ArgumentsDelta(tail[0].call_id, "get_weather", '{"city": "London", "da')]
    assert len(reader.calls) == 1 and not reader.ended


def test_an_unforced_answer_keeps_a_repeated_call() -> None:
    # Calls the model chose freely stream as written: the same call twice may be meant (a die rolled twice).
    _, calls = tool_call_format("hermes").parse(_forced_answer("hermes", PARIS, PARIS), NAMES)
    assert [c.arguments for c in calls] == [PARIS[1], PARIS[1]]


def test_a_raw_tab_in_an_argument_string_still_gives_strict_json() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Los\tAngeles"}}\n</tool_call>'  # a raw tab
    content, calls = tool_call_format("hermes").parse(text, frozenset({"get_weather"}))
    assert content == "" and len(calls) == 1
    assert json.loads(calls[0].arguments) == {"city": "Los\tAngeles"}  # strict parse: the tab is escaped


def test_parser_names_follow_vllm_and_unknown_ones_are_refused() -> None:
    assert {"hermes", "llama3_json", "mistral"} <= set(TOOL_CALL_PARSERS)
    assert tool_call_format("qwen25") is tool_call_format("hermes") is tool_call_format(None)
    with pytest.raises(ValueError, match="hermes"):
        tool_call_format("nonesuch")


# ---- grammars ---------------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "name": "get_weather", "parameters": {"enum": [1, 2]}},  # the realtime shape
]
# One call, two calls, and a call whose arguments break the tool's parameters, in each format.
FORMATTED = {
    "hermes": (
        '<tool_call>\n{"name": "get_weather", "arguments": 2}\n</tool_call>',
        '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": 3',
    ),
    "llama3_json": (
        '{"name": "get_weather", "parameters": 2}',
        '; {"name": "get_time", "parameters": {}}',
        '{"name": "get_weather", "parameters": 3',
    ),
    "mistral": (
        '[{"name": "get_weather", "arguments": 2}',
        ', {"name": "get_time", "arguments": {}}',
        '[{"name": "get_weather", "arguments": 3',
    ),
}


def _matcher(fmt: str, *, required: bool, parallel: bool) -> tuple[object, object]:
    xgr = pytest.importorskip("xgrammar")
    from tests.harness.checkpoints import VOCAB, byte_level_tokenizer

    tag = tool_call_format(fmt).grammar(TOOLS, required=required, parallel=parallel)
    assert tag is not None
    tokenizer = byte_level_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB, stop_token_ids=[tokenizer.eos_token_id])
    compiled = xgr.GrammarCompiler(info).compile_structural_tag(json.dumps(tag))
    return (lambda: xgr.GrammarMatcher(compiled)), tokenizer


@pytest.mark.parametrize("fmt", sorted(FORMATTED))
@pytest.mark.parametrize("parallel", [True, False])
def test_a_forced_call_follows_the_parameters_and_then_only_ends(fmt: str, parallel: bool) -> None:
    matcher, tokenizer = _matcher(fmt, required=True, parallel=parallel)
    one, more, wrong = FORMATTED[fmt]
    close = "]" if fmt == "mistral" else ""
    assert matcher().accept_string(one + close)
    assert matcher().accept_string(one + more + close) == parallel
    assert not matcher().accept_string(wrong)
    assert not matcher().accept_string("plain text")
    ended = matcher()
    assert ended.accept_string(one + close) and ended.accept_token(tokenizer.eos_token_id) and ended.is_terminated()
    if not parallel:  # after the one call the stop token is all there is
        done = matcher()
        assert done.accept_string(one + close)
        assert not any(done.accept_string(ch) for ch in ("\n", " ", ";", ",", "<", "{", "[", "a"))


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json"])
def test_unforced_calls_are_free_text_until_a_call_starts(fmt: str) -> None:
    matcher, _ = _matcher(fmt, required=False, parallel=True)
    one, _, wrong = FORMATTED[fmt]
    assert matcher().accept_string("plain text " + one)
    assert not matcher().accept_string("plain text " + wrong)


def test_unforced_mistral_calls_go_unconstrained() -> None:
    # The model opens them with its [TOOL_CALLS] special token, which a grammar over text cannot name.
    assert tool_call_format("mistral").grammar(TOOLS, required=False, parallel=True) is None


def test_templates_get_every_tool_in_the_chat_shape() -> None:
    from omni_gateway.omni.tools import template_tool

    flat = {"type": "function", "name": "get_time", "description": "now", "parameters": {"type": "object"}}
    shaped = {
        "type": "function",
        "function": {"name": "get_time", "description": "now", "parameters": {"type": "object"}},
    }
    assert template_tool(flat) == shaped and template_tool(shaped) == shaped
