"""Which session and response fields each dialect accepts: GA refuses unknown ones, beta tolerates them."""

from __future__ import annotations

from typing import Any

import pytest
from omni_gateway.gateway.realtime.schema import RC, SU, field_spec
from openai.types.realtime.realtime_response_create_params_param import RealtimeResponseCreateParamsParam
from openai.types.realtime.realtime_session_create_request_param import RealtimeSessionCreateRequestParam

from tests.harness.session_driver import Driver, error, only, types


def ga_update(session: dict[str, Any]) -> dict[str, Any]:
    return {"type": "session.update", "session": {"type": "realtime", **session}}


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"temperature": 0.8}, "session.temperature"),
        ({"modalities": ["text"]}, "session.modalities"),
        ({"voice": "alloy"}, "session.voice"),
        ({"input_audio_format": "pcm16"}, "session.input_audio_format"),
        ({"turn_detection": None}, "session.turn_detection"),
        ({"audio": {"input": {"sample_rate": 16000}}}, "session.audio.input.sample_rate"),
        ({"audio": {"output": {"format": {"type": "audio/pcm", "bits": 16}}}}, "session.audio.output.format.bits"),
        (
            {"audio": {"input": {"turn_detection": {"type": "server_vad", "mode": 1}}}},
            "session.audio.input.turn_detection.mode",
        ),
        ({"tracing": {"workflow_name": "w", "colour": "red"}}, "session.tracing.colour"),
    ],
)
def test_ga_session_refuses_unknown_and_beta_only_fields(session: dict[str, Any], param: str) -> None:
    d = Driver("ga")
    before = d.session.settings
    err = error(d.send(ga_update(session)))
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "unknown_parameter", param)
    assert d.session.settings == before


def test_ga_session_accepts_its_own_session_created_back() -> None:
    d = Driver("ga")
    created = only(d.opened, "session.created")["session"]
    assert types(d.send({"type": "session.update", "session": created})) == ["session.updated"]


def test_ga_unknown_key_is_cut_in_the_error() -> None:
    err = error(Driver("ga").send(ga_update({"k" * 100_000: 1})))
    assert err["code"] == "unknown_parameter" and len(err["message"]) < 200 and len(err["param"]) < 100


def test_ga_response_refuses_unknown_fields() -> None:
    d = Driver("ga")
    for response, param in (
        ({"temperature": 0.8}, "response.temperature"),
        ({"modalities": ["text"]}, "response.modalities"),
        ({"audio": {"output": {"speed": 1.0}}}, "response.audio.output.speed"),
    ):
        err = error(d.send({"type": "response.create", "response": response}))
        assert (err["code"], err["param"]) == ("unknown_parameter", param)
    assert d.session.running_responses == ()


def test_beta_session_ignores_unknown_fields_but_refuses_ga_spellings() -> None:
    d = Driver("beta")
    assert types(d.send({"type": "session.update", "session": {"client_secret": None, "x": 1}})) == ["session.updated"]
    err = error(d.send({"type": "session.update", "session": {"output_modalities": ["text"]}}))
    assert (err["code"], err["param"]) == ("unknown_parameter", "session.output_modalities")
    assert "'modalities'" in err["message"]
    err = error(d.send({"type": "response.create", "response": {"max_output_tokens": 5}}))
    assert (err["code"], err["param"]) == ("unknown_parameter", "response.max_output_tokens")


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"include": "item.input_audio_transcription.logprobs"}, "invalid_type", "session.include"),
        ({"include": ["logprobs"]}, "invalid_value", "session.include[0]"),
        ({"tracing": "on"}, "invalid_value", "session.tracing"),
        ({"tracing": {"group_id": 5}}, "invalid_type", "session.tracing.group_id"),
        ({"tracing": {"metadata": []}}, "invalid_type", "session.tracing.metadata"),
        ({"prompt": "pmpt_1"}, "invalid_type", "session.prompt"),
        ({"prompt": {"version": "1"}}, "missing_required_parameter", "session.prompt.id"),
        ({"prompt": {"id": "pmpt_1", "variables": 3}}, "invalid_type", "session.prompt.variables"),
        ({"prompt": {"id": "pmpt_1"}}, "unsupported_parameter", "session.prompt"),
        ({"model": 5}, "invalid_type", "session.model"),
        (
            {"audio": {"input": {"transcription": {"language": 7}}}},
            "invalid_type",
            "session.audio.input.transcription.language",
        ),
        (
            {"audio": {"input": {"noise_reduction": {"type": "loud"}}}},
            "invalid_value",
            "session.audio.input.noise_reduction.type",
        ),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000.0}}}},
            "invalid_value",
            "session.audio.input.format.rate",
        ),
    ],
)
def test_ga_stored_options_are_validated(session: dict[str, Any], code: str, param: str) -> None:
    err = error(Driver("ga").send(ga_update(session)))
    assert (err["code"], err["param"]) == (code, param)


def test_ga_valid_options_are_echoed() -> None:
    d = Driver("ga")
    tracing = {"workflow_name": "w", "group_id": "g", "metadata": {"a": 1}}
    sent = {"include": ["item.input_audio_transcription.logprobs"], "tracing": tracing, "prompt": None}
    echoed = only(d.send(ga_update(sent)), "session.updated")["session"]
    assert (echoed["include"], echoed["tracing"], echoed["prompt"]) == (sent["include"], tracing, None)
    echoed = only(d.send(ga_update({"tracing": "auto", "include": None})), "session.updated")["session"]
    assert (echoed["include"], echoed["tracing"]) == (None, "auto")


def test_beta_include_and_tracing_are_validated_too() -> None:
    d = Driver("beta")
    err = error(d.send({"type": "session.update", "session": {"include": [1]}}))
    assert (err["code"], err["param"]) == ("invalid_value", "session.include[0]")
    err = error(d.send({"type": "transcription_session.update", "session": {"include": {}}}))
    assert (err["code"], err["param"]) == ("invalid_type", "session.include")


def test_beta_response_temperature_is_bounded_like_the_session() -> None:
    err = error(Driver("beta").send({"type": "response.create", "response": {"temperature": float("inf")}}))
    assert (err["code"], err["param"]) == ("invalid_value", "response.temperature")


def _sdk_keys(annotated: type) -> set[str]:
    return set(annotated.__annotations__)


def test_every_ga_field_of_the_openai_sdk_is_known_so_none_is_an_unknown_parameter() -> None:
    for event, prefix, annotated in (
        (SU, "session", RealtimeSessionCreateRequestParam),
        (RC, "response", RealtimeResponseCreateParamsParam),
    ):
        missing = {k for k in _sdk_keys(annotated) if field_spec(event, "ga", f"{prefix}.{k}") is None}
        assert not missing, f"{prefix}: {sorted(missing)}"


def test_reasoning_options_pass_only_where_they_change_nothing() -> None:
    d = Driver("ga")
    assert types(d.send(ga_update({"parallel_tool_calls": False, "reasoning": None}))) == ["session.updated"]
    for session, code, param in (
        ({"parallel_tool_calls": True}, "unsupported_parameter", "session.parallel_tool_calls"),
        ({"parallel_tool_calls": "yes"}, "invalid_type", "session.parallel_tool_calls"),
        ({"reasoning": {"effort": "low"}}, "unsupported_parameter", "session.reasoning"),
    ):
        err = error(d.send(ga_update(session)))
        assert (err["code"], err["param"]) == (code, param)
    err = error(d.send({"type": "response.create", "response": {"parallel_tool_calls": True}}))
    assert (err["code"], err["param"]) == ("unsupported_parameter", "response.parallel_tool_calls")
