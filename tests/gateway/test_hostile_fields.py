"""Values that once escaped as exceptions, or came back whole in an error, each answered now by one error."""

from __future__ import annotations

from typing import Any

import pytest
from omni_gateway.gateway.http.errors import ApiError
from omni_gateway.gateway.http.image_request import parse_image_generation
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.sampling import check_model
from omni_gateway.omni.protocol import Capabilities

from tests.harness.session_driver import Driver, error

BIG = "x" * (1 << 20)
CAPS = Capabilities(model="m", input_modalities=frozenset({"text"}), output_modalities=frozenset({"text", "image"}))


def ga_update(session: dict[str, Any]) -> dict[str, Any]:
    return {"type": "session.update", "session": {"type": "realtime", **session}}


@pytest.mark.parametrize("role", [["user"], {"r": 1}])
def test_an_unhashable_item_role_is_an_invalid_value(role: Any) -> None:
    item = {"type": "message", "role": role, "content": []}
    err = error(Driver("ga").send({"type": "conversation.item.create", "item": item}))
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "invalid_value", "item.role")


def test_an_unhashable_audio_format_type_is_an_invalid_value() -> None:
    err = error(Driver("ga").send(ga_update({"audio": {"output": {"format": {"type": ["audio/pcm"]}}}})))
    assert (err["code"], err["param"]) == ("invalid_value", "session.audio.output.format.type")


def test_an_unhashable_eagerness_is_an_invalid_value() -> None:
    turn = {"type": "semantic_vad", "eagerness": {"level": "low"}}
    err = error(Driver("beta").send({"type": "session.update", "session": {"turn_detection": turn}}))
    assert (err["code"], err["param"]) == ("invalid_value", "session.turn_detection.eagerness")


def test_function_call_arguments_must_be_text() -> None:
    item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}
    err = error(Driver("ga").send({"type": "conversation.item.create", "item": item}))
    assert (err["code"], err["param"]) == ("invalid_type", "item.arguments")


def test_tool_and_voice_errors_name_the_exact_field() -> None:
    d = Driver("ga")
    err = error(d.send(ga_update({"tools": [{"type": "function", "name": 3}]})))
    assert (err["code"], err["param"]) == ("invalid_type", "session.tools[0].name")
    err = error(d.send(ga_update({"tools": [{"type": "web_search", "name": "f"}]})))
    assert (err["code"], err["param"]) == ("invalid_value", "session.tools[0].type")
    err = error(d.send(ga_update({"audio": {"output": {"voice": {"id": 3}}}})))
    assert (err["code"], err["param"]) == ("invalid_type", "session.audio.output.voice.id")


def test_non_ascii_digits_in_a_realtime_image_size_are_an_invalid_value() -> None:
    d = Driver("ga")
    d.text_item()
    err = error(d.send({"type": "response.create", "response": {"image": {"size": "64x\u00b2"}}}))
    assert (err["code"], err["param"]) == ("invalid_value", "response.image.size")


def test_non_ascii_digits_in_an_http_image_size_are_a_400() -> None:
    with pytest.raises(ApiError) as raised:
        parse_image_generation({"prompt": "a cat", "size": "64x\u00b2"}, CAPS, HttpLimits())
    assert (raised.value.status, raised.value.param) == (400, "size")


def test_a_megabyte_model_name_is_not_echoed_whole() -> None:
    with pytest.raises(ApiError) as raised:
        check_model({"model": BIG}, CAPS)
    assert raised.value.status == 404 and len(raised.value.message) < 300


def test_a_megabyte_event_id_is_not_echoed_in_the_error() -> None:
    err = error(Driver("ga").send({"type": "session.update", "event_id": BIG, "session": {"type": "nope"}}))
    assert err["code"] == "invalid_value" and err["event_id"] is None
    err = error(Driver("ga").send({"type": "session.update", "event_id": "evt_1", "session": {"type": "nope"}}))
    assert err["event_id"] == "evt_1"
