"""Hostile values for every client field, generated from the field tables, driven through the pure layers.

    python -m benchmarks.fuzz_fields [--app-every N] [--out FILE]

Every field of ``gateway/realtime/schema.py`` (per event and dialect) and ``gateway/http/schema.py`` (per
route) gets wrong types, boundary values, oversized and invalid text, deep nesting and unknown keys, each
placed into an otherwise valid event or body. Realtime cases go as JSON text through a sans-I/O
``RealtimeSession``; HTTP cases through the request parsers, and every ``--app-every``-th one also through
the Starlette app over the fake backend. Each case must: raise nothing, emit no ``server_error`` (HTTP: no
5xx), close nothing, answer with at most one error whose message stays under 2 KB, and where the table says
all there is to validity (``exact``), answer an invalid value with exactly one error naming the field and a
valid one with none. A new field in a table is fuzzed without touching this file.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from omni_gateway.gateway.field_spec import FieldSpec
from omni_gateway.gateway.http import schema as http_schema
from omni_gateway.gateway.http.errors import ApiError
from omni_gateway.gateway.realtime import schema as rt_schema
from omni_gateway.gateway.realtime.commands import Close, Send
from omni_gateway.gateway.realtime.frames import serialize

from benchmarks.lib.common import ResultLog, add_out_argument

MAX_ERROR_BYTES = 2048
JSON_DEPTH = 1000  # one level past what Python's JSON decoder takes: the document is refused as a whole
_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
    )
).decode()


class Deep:
    """A value nested ``depth`` levels (lists or objects); written into the JSON text directly."""

    def __init__(self, depth: int, kind: str) -> None:
        self.depth, self.kind = depth, kind

    def text(self) -> str:
        if self.kind == "list":
            return "[" * self.depth + "]" * self.depth
        return '{"a":' * self.depth + "1" + "}" * self.depth


_DEEP_MARK = "\x00deep\x00"


def to_json(document: Any) -> str:
    """JSON text of ``document`` with its ``Deep`` value (at most one) spelled out; NaN as Python writes it."""
    deep: list[Deep] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Deep):
            deep.append(value)
            return _DEEP_MARK
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(document))
    return text.replace(json.dumps(_DEEP_MARK), deep[0].text()) if deep else text


# ---- values ------------------------------------------------------------------------------------
def hostile_values(spec: FieldSpec) -> list[tuple[str, Any]]:
    """(label, value) pairs for ``spec``: the generic hostile set plus its own bounds and choices."""
    values: list[tuple[str, Any]] = [
        ("null", None),
        ("true", True),
        ("false", False),
        ("int_0", 0),
        ("int_1", 1),
        ("int_-1", -1),
        ("int_2^70", 2**70),
        ("float_0.5", 0.5),
        ("nan", math.nan),
        ("infinity", math.inf),
        ("-infinity", -math.inf),
        ("str_empty", ""),
        ("str_x", "x"),
        ("str_NaN", "NaN"),
        ("str_Infinity", "Infinity"),
        ("str_unicode_digits", "64x\u00b2"),
        ("str_1MiB", "a" * (1 << 20)),
        ("lone_surrogate", "\ud800"),
        ("list_empty", []),
        ("list_int", [1]),
        ("list_str", ["x"]),
        ("object_empty", {}),
        ("object_unknown_key", {"unknown_key": 1}),
        (f"deep_list_{JSON_DEPTH}", Deep(JSON_DEPTH, "list")),
        (f"deep_object_{JSON_DEPTH}", Deep(JSON_DEPTH, "object")),
        ("deep_object_900", Deep(900, "object")),
    ]
    integer = "integer" in spec.kinds
    step = 1 if integer else 0.01
    for name, bound in (("lo", spec.lo), ("hi", spec.hi)):
        if bound is not None:
            b = int(bound) if integer else bound
            values += [(f"{name}", b), (f"{name}-step", b - step), (f"{name}+step", b + step)]
    for choice in spec.choices:
        values += [(f"choice_{choice}", choice), (f"choice_{choice}_x", choice + "x"), ("choice_upper", choice.upper())]
    if spec.items:
        values += [(f"items_{item}", [item]) for item in spec.items]
        values += [
            ("items_all", list(spec.items)),
            ("items_bad", [spec.items[0] + "x"]),
            ("items_dup", [spec.items[0]] * 2),
        ]
    if spec.max_len is not None:
        values += [("max_len", "a" * spec.max_len), ("max_len+1", "a" * (spec.max_len + 1))]
    return values


def _number_ok(spec: FieldSpec, value: float) -> bool:
    return math.isfinite(value) and (spec.lo is None or value >= spec.lo) and (spec.hi is None or value <= spec.hi)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def accepts(spec: FieldSpec, value: Any, *, strict: bool = True) -> bool:
    """Whether ``value`` is valid for ``spec`` by its kinds, bounds and choices (meaningful when ``exact``);
    ``strict``: closed objects refuse unknown keys (the GA dialect)."""
    if isinstance(value, Deep):
        if value.depth >= JSON_DEPTH:
            return False  # deeper than the JSON decoder goes: the whole document is refused
        value = [[]] if value.kind == "list" else {"a": {}}
    if isinstance(value, str) and not _encodable(value):
        return False
    if "any" in spec.kinds:
        return True
    if value is None:
        return spec.nullable
    if isinstance(value, bool):
        return "boolean" in spec.kinds
    if isinstance(value, int) and ("integer" in spec.kinds or "number" in spec.kinds):
        return _number_ok(spec, value)
    if isinstance(value, float):
        return "number" in spec.kinds and _number_ok(spec, value)
    if isinstance(value, str):
        return (
            "string" in spec.kinds
            and (not spec.choices or value in spec.choices)
            and (spec.max_len is None or len(value) <= spec.max_len)
        )
    if isinstance(value, list):
        if "array" not in spec.kinds or len(value) < spec.min_items:
            return False
        return not spec.items or all(v in spec.items for v in value)
    if isinstance(value, dict):
        if "object" not in spec.kinds or any(k not in value for k in spec.required):
            return False
        return not (strict and spec.closed and value)  # the generic objects carry only unknown keys
    return False


def set_path(document: dict[str, Any], path: str, value: Any) -> None:
    """Place ``value`` at ``path`` (``a.b[].c``: index 0 of ``b``), creating missing objects on the way."""
    node: Any = document
    parts = path.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part.endswith("[]"):
            key = part[:-2]
            if not isinstance(node.get(key), list) or not node[key]:
                node[key] = [{}]
            if last:
                node[key][0] = value
                return
            node = node[key][0]
        elif last:
            node[part] = value
        else:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]


def param_names(param: Any, path: str) -> bool:
    """Whether an error's ``param`` names the field at ``path`` (or a part of its value)."""
    if not isinstance(param, str):
        return False
    want = path.replace("[]", "[0]")
    return param == want or param.startswith((want + ".", want + "["))


# ---- cases ----------------------------------------------------------------------------------------
@dataclass
class Outcome:
    surface: str  # "realtime" | "http" | "http_app"
    field: str  # the field's key: event or route, dialect, path
    label: str
    errors: int = 0
    status: int | None = None  # HTTP
    closed: bool = False
    server_error: bool = False
    exception: str | None = None
    problems: list[str] = field(default_factory=list)  # broken expectations, described


def _check(
    outcome: Outcome, spec: FieldSpec, value: Any, errors: list[dict[str, Any]], path: str, strict: bool = True
) -> None:
    if len(errors) > 1:
        outcome.problems.append(f"{len(errors)} errors")
    for err in errors:
        if len(json.dumps(err)) >= MAX_ERROR_BYTES:
            outcome.problems.append(f"error of {len(json.dumps(err))} bytes")
    if not spec.exact:
        return
    valid = accepts(spec, value, strict=strict)
    if valid and errors:
        outcome.problems.append(f"valid value refused: {errors[0].get('message', '')[:200]}")
    elif not valid and not errors:
        outcome.problems.append("invalid value accepted")
    elif not valid and not isinstance(value, Deep) and not param_names(errors[0].get("param"), path):
        outcome.problems.append(f"error names {errors[0].get('param')!r}, not {path!r}")


# ---- realtime -------------------------------------------------------------------------------------
_SILENCE = base64.b64encode(bytes(4800)).decode()  # 100 ms of 24 kHz pcm16
_USER_ITEM = {"id": "u1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
_CALL_ITEM = {"id": "c1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
_ASSISTANT_AUDIO = {
    "id": "a1",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "output_audio", "audio": _SILENCE, "transcript": "hi"}],
}


def _create(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": rt_schema.IC, "item": item}


def _realtime_base(event: str, dialect: str, path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(setup events, a valid event of this type) for fuzzing ``path``."""
    setup: list[dict[str, Any]] = []
    base: dict[str, Any] = {"type": event}
    if event == rt_schema.SU:
        base["session"] = {"type": "realtime"} if dialect == "ga" else {}
    elif event == rt_schema.TSU:
        base["session"] = {}
    elif event == rt_schema.RC:
        base["response"] = {}
        setup.append(_create(_USER_ITEM))  # something to respond to
        if path.startswith("response.input[]"):
            base["response"]["input"] = [{"type": "item_reference", "id": "u1"}]
    elif event == rt_schema.IC:
        kind = path.rsplit(".", 1)[-1]
        if kind in ("call_id", "name", "arguments"):
            base["item"] = dict(_CALL_ITEM, id=None)
        elif kind == "output":
            setup.append(_create(_CALL_ITEM))
            base["item"] = {"type": "function_call_output", "call_id": "call_1", "output": "42"}
        elif kind in ("transcript", "audio"):
            base["item"] = dict(_USER_ITEM, id=None, content=[{"type": "input_audio", "audio": _SILENCE}])
        elif kind in ("image_url", "detail"):
            image = {"type": "input_image", "image_url": "data:image/png;base64," + _PNG}
            base["item"] = dict(_USER_ITEM, id=None, content=[image])
        else:
            base["item"] = dict(_USER_ITEM, id=None)
    elif event == rt_schema.IA:
        base["audio"] = _SILENCE
    elif event == rt_schema.IT:
        setup.append(_create(_ASSISTANT_AUDIO))
        base.update(item_id="a1", content_index=0, audio_end_ms=50)
    elif event in (rt_schema.IR, rt_schema.ID):
        setup.append(_create(_USER_ITEM))
        base["item_id"] = "u1"
    elif event == rt_schema.CANCEL:
        setup += [_create(_USER_ITEM), {"type": rt_schema.RC}]
    elif event == rt_schema.COMMIT:
        setup.append({"type": rt_schema.IA, "audio": _SILENCE * 2})
    _add_context(base, path)
    return setup, copy.deepcopy(base)


def _add_context(base: dict[str, Any], path: str) -> None:
    """The sibling keys a field needs to mean something (a semantic_vad type for eagerness, ...)."""
    parent, _, key = path.rpartition(".")
    if parent.endswith("turn_detection"):
        set_path(base, parent, {"type": "semantic_vad" if key == "eagerness" else "server_vad"})
    elif parent.endswith(".format"):
        set_path(base, parent, {"type": "audio/pcm"})
    elif parent.endswith("tool_choice"):
        set_path(base, parent, {"type": "function", "name": "f"})
    elif parent.endswith("tools[]"):
        set_path(base, parent, {"type": "function", "name": "f"})
    elif parent.endswith("truncation"):
        set_path(base, parent, {"type": "retention_ratio", "retention_ratio": 0.5})
    elif parent.endswith("prompt"):
        set_path(base, parent, {"id": "pmpt_1"})


def realtime_fields() -> list[tuple[str, str, FieldSpec]]:
    return [
        (event, dialect, spec)
        for spec in rt_schema.FIELDS
        for event in spec.events
        for dialect in spec.dialects
        if not (event == rt_schema.TSU and dialect == "ga")  # a beta event only
    ]


def _run_realtime(event: str, dialect: str, document: Any, setup: list[dict[str, Any]]) -> tuple[list[Any], Any]:
    from tests.harness.session_driver import Driver

    driver = Driver(dialect)
    for step in setup:
        out = driver.send(step)
        assert not any(isinstance(o, Send) and o.event["type"] == "error" for o in out), (step, out)
    return driver.session.receive_text(to_json(document)), driver


def realtime_case(event: str, dialect: str, spec: FieldSpec, label: str, value: Any) -> Outcome:
    outcome = Outcome("realtime", f"{event} [{dialect}] {spec.path}", label)
    setup, base = _realtime_base(event, dialect, spec.path)
    if spec.path == "type":
        base["type"] = value
    else:
        set_path(base, spec.path, value)
    try:
        out, _ = _run_realtime(event, dialect, base, setup)
        for o in out:
            if isinstance(o, Send):
                serialize(o.event)  # what the connection does with it
    except Exception as exc:  # noqa: BLE001 - recorded: the figure "exceptions" must be 0
        outcome.exception = f"{type(exc).__name__}: {str(exc)[:200]}"
        return outcome
    errors = [o.event["error"] for o in out if isinstance(o, Send) and o.event["type"] == "error"]
    outcome.errors = len(errors)
    outcome.closed = any(isinstance(o, Close) for o in out)
    outcome.server_error = any(e.get("type") == "server_error" for e in errors)
    _check(outcome, spec, value, errors, spec.path, strict=dialect == "ga")
    return outcome


def realtime_baselines() -> list[str]:
    """The unmutated base events that get an error (each must be valid, or the oracle means nothing)."""
    broken = []
    for event, dialect, spec in realtime_fields():
        if not spec.exact:
            continue
        setup, base = _realtime_base(event, dialect, spec.path)
        out, _ = _run_realtime(event, dialect, base, setup)
        if any(isinstance(o, Send) and o.event["type"] == "error" for o in out):
            broken.append(f"{event} [{dialect}] {spec.path}")
    return broken


# ---- HTTP ------------------------------------------------------------------------------------------
def _http_base(route: str, path: str) -> dict[str, Any]:
    return copy.deepcopy(_http_template(route, path))


def _http_template(route: str, path: str) -> dict[str, Any]:
    if route == http_schema.CHAT:
        body: dict[str, Any] = {"model": "omni-test", "messages": [{"role": "user", "content": "hi"}]}
        if path.startswith("messages[].content[]"):
            part: dict[str, Any] = {"type": "text", "text": "hi"}
            if ".image_url" in path:
                part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _PNG}}
            elif ".input_audio" in path:
                part = {"type": "input_audio", "input_audio": {"format": "mp3", "data": _SILENCE}}
            elif path.endswith(".refusal"):
                body["messages"] = [{"role": "assistant", "content": []}]
                part = {"type": "refusal", "refusal": "no"}
            body["messages"][0]["content"] = [part]
        elif path.startswith("messages[].tool_calls"):
            call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            body["messages"] = [{"role": "assistant", "content": None, "tool_calls": [call]}]
        elif path == "messages[].tool_call_id":
            body["messages"] = [{"role": "tool", "content": "42", "tool_call_id": "call_1"}]
        elif path.startswith("stream_options"):
            body.update(stream=True, stream_options={"include_usage": True})
        elif path == "top_logprobs":
            body["logprobs"] = True
        elif path.startswith("audio"):
            body.update(modalities=["text", "audio"], audio={"voice": "joe", "format": "wav"})
        elif path.startswith(("tools", "tool_choice")):
            body["tools"] = [{"type": "function", "function": {"name": "f"}}]
            if path.startswith("tool_choice"):
                body["tool_choice"] = {"type": "function", "function": {"name": "f"}}
        elif path.startswith("response_format"):
            body["response_format"] = {"type": "text"}
        return body
    if route == http_schema.COMPLETIONS:
        body = {"model": "omni-test", "prompt": "hi"}
        if path.startswith("stream_options"):
            body.update(stream=True, stream_options={"include_usage": True})
        return body
    if route == http_schema.RESPONSES:
        return _responses_template(path)
    if route == http_schema.MESSAGES:
        return _messages_template(path)
    if route == http_schema.EMBEDDINGS:
        return {"model": "omni-test", "input": "hi"}
    if route == http_schema.IMAGES:
        return {"prompt": "a cat"}
    if route == http_schema.SPEECH:
        return {"model": "tts-1", "input": "hello", "voice": "joe"}
    return {"model": "whisper-1"}


def _responses_template(path: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "omni-test", "input": "hi"}
    item: dict[str, Any] = {"type": "message", "role": "user", "content": "hi"}
    if path.startswith("input[].content[]"):
        part: dict[str, Any] = {"type": "input_text", "text": "hi"}
        if path.endswith((".image_url", ".detail", ".file_id")):
            part = {"type": "input_image", "image_url": "data:image/png;base64," + _PNG, "detail": "auto"}
        elif path.endswith((".file_data", ".file_url")):
            part = {"type": "input_file", "file_data": "data:audio/mpeg;base64," + _SILENCE}
        elif path.endswith(".input_audio"):
            part = {"type": "input_audio", "input_audio": {"format": "mp3", "data": _SILENCE}}
        elif path.endswith(".refusal"):
            item["role"] = "assistant"
            part = {"type": "refusal", "refusal": "no"}
        item["content"] = [part]
    elif path.endswith((".call_id", ".name", ".arguments")):
        item = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    elif ".output" in path:
        item = {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "x"}]}
    if path.startswith("input[]"):
        body["input"] = [item]
    elif path.startswith(("tools", "tool_choice")):
        body["tools"] = [{"type": "function", "name": "f"}]
        if path.startswith("tool_choice"):
            body["tool_choice"] = {"type": "function", "name": "f"}
    elif path.startswith("text.format."):
        body["text"] = {"format": {"type": "json_schema", "name": "x", "schema": {}}}
    elif path.startswith("text"):
        body["text"] = {"format": {"type": "text"}}
    elif path.startswith("reasoning"):
        body["reasoning"] = {}
    return body


def _messages_template(path: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "omni-test", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    if path.startswith("messages[].content[]"):
        role, block = "user", {"type": "text", "text": "hi"}
        if ".source" in path:
            block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _PNG}}
        elif path.endswith((".id", ".name", ".input")):
            role, block = "assistant", {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
        elif path.endswith((".tool_use_id", ".is_error")) or ".content" in path[len("messages[].content[]") :]:
            block = {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "x"}]}
        body["messages"] = [{"role": role, "content": [block]}]
    elif path.startswith("system[]"):
        body["system"] = [{"type": "text", "text": "be brief"}]
    elif path.startswith(("tools", "tool_choice")):
        body["tools"] = [{"name": "f", "input_schema": {"type": "object"}}]
        if path.startswith("tool_choice"):
            body["tool_choice"] = {"type": "tool", "name": "f"}
    elif path.startswith("output_config"):
        body["output_config"] = {"format": {"type": "json_schema", "schema": {}}}
    elif path.startswith("thinking"):
        body["thinking"] = {"type": "disabled"}
    return body


def http_fields() -> list[tuple[str, FieldSpec]]:
    return [(route, spec) for spec in http_schema.FIELDS for route in spec.events]


def http_parse(route: str, body: Any) -> Any:
    """Run the route's parser on a decoded body, as the handler does."""
    from dataclasses import replace

    from omni_gateway.gateway.http.audio_request import parse_speech, parse_transcription_form
    from omni_gateway.gateway.http.chat_request import parse_chat
    from omni_gateway.gateway.http.completion_request import parse_completion
    from omni_gateway.gateway.http.image_request import parse_image_generation
    from omni_gateway.gateway.http.limits import HttpLimits

    from tests.harness.fake_backend import FakeBackend

    caps, limits = FakeBackend().capabilities, HttpLimits()
    if route == http_schema.CHAT:
        return parse_chat(body, caps, limits)
    if route == http_schema.COMPLETIONS:
        return parse_completion(body, caps, limits)
    if route == http_schema.RESPONSES:
        from omni_gateway.gateway.http.responses_request import parse_responses
        from omni_gateway.gateway.http.responses_store import ResponseStore

        return parse_responses(body, caps, limits, ResponseStore(8))
    if route == http_schema.MESSAGES:
        from omni_gateway.gateway.http.messages_request import parse_messages_body

        return parse_messages_body(body, caps, limits)
    if route == http_schema.EMBEDDINGS:
        from omni_gateway.gateway.http.embeddings import parse_embeddings

        return parse_embeddings(body, caps, limits)
    if route == http_schema.IMAGES:
        image_caps = replace(caps, output_modalities=caps.output_modalities | {"image"})
        return parse_image_generation(body, image_caps, limits)
    if route == http_schema.SPEECH:
        return parse_speech(body, caps, limits)
    return parse_transcription_form(body, caps)


def _decoded(document: dict[str, Any]) -> Any:
    """The body as the endpoint's JSON decoding leaves it (None: refused as invalid JSON)."""
    try:
        return json.loads(to_json(document))
    except (ValueError, RecursionError):
        return None


def http_case(route: str, spec: FieldSpec, label: str, value: Any) -> Outcome:
    outcome = Outcome("http", f"{route} {spec.path}", label)
    body = _http_base(route, spec.path)
    set_path(body, spec.path, value)
    decoded = _decoded(body)
    errors: list[dict[str, Any]] = []
    if decoded is None:
        errors.append({"message": "invalid JSON", "param": None})  # the endpoint's own refusal, before parsing
        outcome.status = 400
    else:
        try:
            from omni_gateway.gateway.client_text import invalid_text_path

            if invalid_text_path(decoded) is not None:  # read_json refuses it before the parser
                errors.append({"message": "lone surrogate", "param": invalid_text_path(decoded)})
                outcome.status = 400
            else:
                http_parse(route, decoded)
                outcome.status = 200
        except ApiError as err:
            outcome.status = err.status
            errors.append(err.body()["error"])
        except Exception as exc:  # noqa: BLE001 - recorded: the figure "exceptions" must be 0
            outcome.exception = f"{type(exc).__name__}: {str(exc)[:200]}"
            return outcome
    outcome.errors = len(errors)
    outcome.server_error = outcome.status is not None and outcome.status >= 500
    _check(outcome, spec, value, errors, spec.path)
    return outcome


APP_ROUTES = (
    http_schema.CHAT,
    http_schema.COMPLETIONS,
    http_schema.SPEECH,
    http_schema.RESPONSES,
    http_schema.MESSAGES,
    http_schema.EMBEDDINGS,
)


def http_app_case(client: Any, route: str, spec: FieldSpec, label: str, value: Any) -> Outcome:
    """The same body through the whole app (fake backend): no 5xx, a JSON error for every 4xx."""
    outcome = Outcome("http_app", f"{route} {spec.path}", label)
    body = _http_base(route, spec.path)
    set_path(body, spec.path, value)
    try:
        response = client.post(route, content=to_json(body), headers={"content-type": "application/json"})
    except Exception as exc:  # noqa: BLE001
        outcome.exception = f"{type(exc).__name__}: {str(exc)[:200]}"
        return outcome
    outcome.status = response.status_code
    outcome.server_error = response.status_code >= 500
    if response.status_code >= 400:
        outcome.errors = 1
        error = response.json().get("error", {})
        if len(response.content) >= MAX_ERROR_BYTES:
            outcome.problems.append(f"error of {len(response.content)} bytes")
        if spec.exact and accepts(spec, value) is True and response.status_code != 400:
            outcome.problems.append(f"valid value answered {response.status_code}: {error.get('message', '')[:200]}")
    elif spec.exact and not accepts(spec, value):
        outcome.problems.append(f"invalid value answered {response.status_code}")
    return outcome


# ---- running ---------------------------------------------------------------------------------------
def all_cases() -> Iterator[tuple[str, Callable[[], Outcome], Callable[[Any], Outcome] | None]]:
    """(field key, realtime-or-parser case, app case or None) for every field and value."""
    for event, dialect, spec in realtime_fields():
        for label, value in hostile_values(spec):
            yield (
                f"realtime {event} [{dialect}] {spec.path}",
                lambda e=event, d=dialect, s=spec, lb=label, v=value: realtime_case(e, d, s, lb, v),
                None,
            )
    for route, spec in http_fields():
        for label, value in hostile_values(spec):
            app = (
                (lambda c, r=route, s=spec, lb=label, v=value: http_app_case(c, r, s, lb, v))
                if route in APP_ROUTES
                else None
            )
            yield f"http {route} {spec.path}", (lambda r=route, s=spec, lb=label, v=value: http_case(r, s, lb, v)), app


def app_client() -> Any:
    from omni_gateway.gateway.app import create_app
    from starlette.testclient import TestClient

    from tests.harness.fake_backend import FakeBackend

    return TestClient(create_app(FakeBackend()), base_url="http://localhost")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app-every", type=int, default=1, help="send every N-th HTTP case through the app too")
    add_out_argument(parser, "fuzz_fields")
    args = parser.parse_args()
    broken = realtime_baselines()
    if broken:
        raise SystemExit(f"base events that are not valid themselves: {broken}")
    outcomes: list[Outcome] = []
    per_field: dict[str, int] = {}
    with app_client() as client, ResultLog(args.out, "fuzz_fields", app_every=args.app_every) as log:
        for i, (key, case, app) in enumerate(all_cases()):
            per_field[key] = per_field.get(key, 0) + 1
            outcomes.append(case())
            if app is not None and i % args.app_every == 0:
                outcomes.append(app(client))
        bad = [o for o in outcomes if o.problems or o.exception or o.server_error]
        for o in bad:
            log.write("failure", **o.__dict__)
        counts = sorted(per_field.values())
        figures = {
            "fields_realtime": len({(e, s.path) for e, _, s in realtime_fields()}),
            "fields_realtime_per_dialect": sum(k.startswith("realtime") for k in per_field),
            "fields_http": sum(k.startswith("http") for k in per_field),
            "cases_per_field_min": counts[0],
            "cases_per_field_median": statistics.median(counts),
            "cases_per_field_max": counts[-1],
            "cases": len(outcomes),
            "realtime_error_events": sum(o.errors for o in outcomes if o.surface == "realtime"),
            "http_4xx": sum(1 for o in outcomes if o.status is not None and 400 <= o.status < 500),
            "connections_closed": sum(o.closed for o in outcomes),
            "server_errors": sum(o.server_error for o in outcomes),
            "exceptions": sum(o.exception is not None for o in outcomes),
            "broken_expectations": sum(bool(o.problems) for o in outcomes),
        }
        log.write("figures", **figures)
    for o in bad[:40]:
        print(f"  {o.surface} {o.field} [{o.label}]: {o.exception or ''} {'; '.join(o.problems)}")
    width = max(len(k) for k in figures)
    for k, v in figures.items():
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
