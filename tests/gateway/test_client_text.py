"""Lone UTF-16 surrogates in client text are refused at the boundary, HTTP and realtime alike."""

from __future__ import annotations

import json

import httpx
import pytest
from omni_gateway.gateway.client_text import invalid_text_path, shown

from tests.harness.session_driver import Driver, error, only, started, types

LONE = json.loads('"a\\ud800b"')


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("fine ünïcödé 🎧", None),
        ({"a": [1, {"b": "ok"}, {"c": LONE}]}, "a[2].c"),
        ([LONE], "[0]"),
        ({LONE: 1}, ""),
        (LONE, ""),
        ({"x": [[[[json.loads('"\\udfff"')]]]]}, "x[0][0][0][0]"),
    ],
)
def test_the_path_of_the_first_lone_surrogate_is_found(value: object, path: str | None) -> None:
    assert invalid_text_path(value) == path


def test_a_surrogate_pair_spelled_in_json_is_valid() -> None:
    assert invalid_text_path(json.loads('{"t": "\\ud83c\\udfa7"}')) is None


def test_http_body_with_a_lone_surrogate_is_400_naming_the_field(fake) -> None:
    _, url, _ = fake
    body = '{"model": "omni-test", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    r = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"] | {"message": None} == {
        "type": "invalid_request_error",
        "code": "invalid_value",
        "param": "messages[0].content",
        "message": None,
    }
    assert "surrogate" in r.json()["error"]["message"]
    ok = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "omni-test", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert ok.status_code == 200


def test_realtime_event_with_a_lone_surrogate_is_refused_and_not_applied() -> None:
    d = Driver()
    d.text_mode()
    out = d.session.receive_text(
        '{"type": "session.update", "event_id": "e1", '
        '"session": {"type": "realtime", "instructions": "be \\ud800 nice"}}'
    )
    err = error(out)
    assert types(out) == ["error"] and err["code"] == "invalid_value" and err["event_id"] == "e1"
    assert err["param"] == "session.instructions"
    assert d.session.settings.instructions == ""
    d.text_item()
    request = d.session.build_request(started(d.send({"type": "response.create"})))
    assert request is not None and all(p.text.encode() for m in request.messages for p in m.parts)


def test_a_lone_surrogate_in_the_event_id_is_not_echoed() -> None:
    d = Driver()
    out = d.session.receive_text('{"type": "input_audio_buffer.clear", "event_id": "\\ud800"}')
    assert error(out)["event_id"] is None and error(out)["param"] == "event_id"
    assert "input_audio_buffer.cleared" not in types(out)
    only(out, "error")


def test_a_long_value_is_shown_cut_with_its_size() -> None:
    assert shown("short") == "'short'"
    long = "x" * 5_000_000
    text = shown(long)
    assert len(text) < 120 and text.startswith("'xxx") and text.endswith("... (5000000 characters)")


def test_a_realtime_error_never_echoes_a_huge_value() -> None:
    d = Driver()
    huge = "v" * 1_000_000
    out = d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"output": {"speed": 9}}, "truncation": huge},
        }
    )
    assert len(json.dumps(error(out))) < 600 and "(1000000 characters)" in error(out)["message"]
    out = d.send({"type": "conversation.item.retrieve", "item_id": huge})
    assert len(json.dumps(error(out))) < 600


def test_an_http_error_never_echoes_a_huge_value(fake) -> None:
    _, url, _ = fake
    huge = "r" * 1_000_000
    for body in (
        {"model": "omni-test", "messages": [{"role": huge, "content": "hi"}]},
        {"model": "omni-test", "messages": [{"role": "user", "content": "hi"}], "temperature": huge},
    ):
        r = httpx.post(f"{url}/v1/chat/completions", json=body)
        assert r.status_code == 400 and len(r.content) < 600, r.content[:300]
