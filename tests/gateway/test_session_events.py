"""Session-level client events: session.update, items, errors; both dialects, no sockets."""

from __future__ import annotations

import json
import re
import string

import pytest
from omni_gateway.gateway.realtime.commands import new_id

from tests.harness.fake_backend import FakeBackend, tone
from tests.harness.session_driver import Driver, b64, error, events, only, started, types


def test_open_sends_session_created_then_conversation_created() -> None:
    d = Driver()
    assert types(d.opened) == ["session.created", "conversation.created"]
    session = events(d.opened)[0]["session"]
    assert session["type"] == "realtime" and session["model"] == "omni-test"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert all(e["event_id"].startswith("event_") for e in events(d.opened))


def test_ids_are_their_prefix_and_20_random_letters_and_digits() -> None:
    ids = [new_id("event") for _ in range(2000)]
    assert all(re.fullmatch(r"event_[A-Za-z0-9]{20}", i) for i in ids) and len(set(ids)) == len(ids)
    assert set("".join(i[6:] for i in ids)) == set(string.ascii_letters + string.digits)


def test_without_vad_the_default_session_uses_manual_turns() -> None:
    d = Driver(vad=False)
    assert events(d.opened)[0]["session"]["audio"]["input"]["turn_detection"] is None
    err = error(
        d.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
            }
        )
    )
    assert err["code"] == "invalid_value"


def test_ga_session_update_merges_and_echoes_the_full_session() -> None:
    d = Driver()
    first = only(
        d.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]},
            }
        ),
        "session.updated",
    )
    assert first["session"]["instructions"] == "Be brief."
    second = only(
        d.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcmu"},
                            "turn_detection": {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 300},
                        },
                        "output": {"voice": "verse", "speed": 1.2},
                    },
                },
            }
        ),
        "session.updated",
    )["session"]
    # the earlier fields persist: the reply is the whole effective session, not the delta
    assert second["instructions"] == "Be brief." and second["output_modalities"] == ["text"]
    assert second["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert second["audio"]["output"]["voice"] == "verse" and second["audio"]["output"]["speed"] == 1.2
    turn = second["audio"]["input"]["turn_detection"]
    assert (turn["threshold"], turn["silence_duration_ms"], turn["prefix_padding_ms"]) == (0.7, 300, 300)
    assert d.backend.vad_settings[-1].threshold == 0.7 and d.backend.vad_settings[-1].silence_duration_ms == 300
    cleared = only(
        d.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "instructions": "", "audio": {"input": {"turn_detection": None}}},
            }
        ),
        "session.updated",
    )["session"]
    assert cleared["instructions"] == "" and cleared["audio"]["input"]["turn_detection"] is None


def test_beta_session_update_uses_flat_fields() -> None:
    d = Driver("beta")
    created = events(d.opened)[0]["session"]
    assert "type" not in created and created["modalities"] == ["text", "audio"]
    updated = only(
        d.send(
            {
                "type": "session.update",
                "session": {
                    "modalities": ["text"],
                    "voice": "verse",
                    "input_audio_format": "g711_alaw",
                    "temperature": 0.7,
                    "turn_detection": None,
                    "max_response_output_tokens": 200,
                },
            }
        ),
        "session.updated",
    )["session"]
    assert updated["modalities"] == ["text"] and updated["voice"] == "verse"
    assert updated["input_audio_format"] == "g711_alaw" and updated["output_audio_format"] == "pcm16"
    assert updated["turn_detection"] is None and updated["temperature"] == 0.7
    assert updated["max_response_output_tokens"] == 200


def test_semantic_vad_is_accepted_and_eagerness_caps_the_wait() -> None:
    d = Driver()
    low = only(
        d.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}},
                },
            }
        ),
        "session.updated",
    )
    assert low["session"]["audio"]["input"]["turn_detection"]["eagerness"] == "low"
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}},
            },
        }
    )
    low_vad, high_vad = d.backend.vad_settings[-2:]
    assert (low_vad.eagerness, high_vad.eagerness) == ("low", "high")


def test_semantic_vad_on_a_server_without_its_model_is_a_clear_error() -> None:
    from omni_gateway.omni.prompting import UnsupportedInput

    backend = FakeBackend()
    real = backend.new_vad

    def no_semantic(settings):  # type: ignore[no-untyped-def]
        if settings.eagerness is not None:
            raise UnsupportedInput("semantic_vad needs the pipecat-ai package")
        return real(settings)

    backend.new_vad = no_semantic  # type: ignore[method-assign]
    d = Driver(backend=backend)
    out = d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
        }
    )
    err = error(out)
    assert err["param"] == "session.turn_detection.type" and "pipecat-ai" in err["message"]
    assert d.session.settings.turn_detection is not None and d.session.settings.turn_detection.type == "server_vad"


@pytest.mark.parametrize(
    "session, param",
    [
        (
            {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "session.audio.input.format.rate",
        ),
        ({"type": "translation"}, "session.type"),
        ({"type": "realtime", "output_modalities": ["video"]}, "session.output_modalities"),
        ({"type": "realtime", "max_output_tokens": 5000}, "session.max_output_tokens"),
        ({"type": "realtime", "audio": {"output": {"speed": 3}}}, "session.audio.output.speed"),
        (
            {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
            "session.audio.input.turn_detection.threshold",
        ),
        ({"type": "realtime", "tools": [{"type": "function"}]}, "session.tools[0].name"),
    ],
)
def test_invalid_session_update_is_rejected_and_changes_nothing(session: dict, param: str) -> None:
    d = Driver()
    before = d.session.settings
    err = error(d.send({"type": "session.update", "event_id": "evt_1", "session": session}))
    assert err["param"] == param and err["event_id"] == "evt_1" and err["type"] == "invalid_request_error"
    assert d.session.settings == before


def test_voice_cannot_change_after_audio_was_output() -> None:
    d = Driver()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    d.run(rid)
    err = error(
        d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "verse"}}}})
    )
    assert err["code"] == "cannot_update_voice" and err["param"] == "session.audio.output.voice"


@pytest.mark.parametrize(
    "raw, code",
    [
        ("{not json", "invalid_json"),
        ("[1, 2]", "invalid_event"),
        ('{"event_id": "e1"}', "invalid_event"),
        ('{"type": "no.such.event", "event_id": "e2"}', "invalid_event"),
        ('{"type": "input_audio_buffer.append"}', "missing_required_parameter"),
        ('{"type": "input_audio_buffer.append", "audio": "@@@"}', "invalid_value"),
    ],
)
def test_malformed_events_yield_one_error_and_the_session_goes_on(raw: str, code: str) -> None:
    d = Driver()
    out = d.session.receive_text(raw)
    assert types(out) == ["error"] and error(out)["code"] == code
    parsed = json.loads(raw) if raw.startswith(('{"', "[")) else None
    if isinstance(parsed, dict) and "event_id" in parsed:
        assert error(out)["event_id"] == parsed["event_id"]
    assert types(d.text_item()) == ["conversation.item.added", "conversation.item.done"]


def test_missing_type_message_matches_openai() -> None:
    err = error(Driver().session.receive_text('{"event_id": "x"}'))
    assert err["message"] == "The 'type' field is missing." and err["event_id"] == "x"


def test_item_create_keeps_client_id_and_honours_previous_item_id() -> None:
    d = Driver()
    first = only(d.text_item("one", id="item_client_1"), "conversation.item.added")
    assert first["item"]["id"] == "item_client_1" and first["previous_item_id"] is None
    second = only(d.text_item("two", id="msg_2"), "conversation.item.added")
    assert second["previous_item_id"] == "item_client_1"
    at_root = only(
        d.send(
            {
                "type": "conversation.item.create",
                "previous_item_id": "root",
                "item": {
                    "id": "sys_0",
                    "type": "message",
                    "role": "system",
                    "content": [{"type": "input_text", "text": "S"}],
                },
            }
        ),
        "conversation.item.added",
    )
    assert at_root["previous_item_id"] is None
    middle = only(
        d.send(
            {
                "type": "conversation.item.create",
                "previous_item_id": "item_client_1",
                "item": {
                    "id": "mid",
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "m"}],
                },
            }
        ),
        "conversation.item.added",
    )
    assert middle["previous_item_id"] == "item_client_1"
    assert [it.id for it in d.session.items] == ["sys_0", "item_client_1", "mid", "msg_2"]


def test_item_create_errors() -> None:
    d = Driver()
    d.text_item(id="dup")
    assert error(d.text_item(id="dup"))["code"] == "item_id_already_exists"
    unknown = error(
        d.send(
            {
                "type": "conversation.item.create",
                "previous_item_id": "nope",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
            }
        )
    )
    assert unknown["param"] == "previous_item_id"
    bad_role = error(
        d.send({"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}})
    )
    assert bad_role["param"] == "item.role"
    orphan = error(
        d.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": "call_x", "output": "{}"},
            }
        )
    )
    assert orphan["code"] == "invalid_tool_call_id"
    assert len(d.session.items) == 1


def test_beta_item_create_answers_with_conversation_item_created_only() -> None:
    d = Driver("beta")
    out = d.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        }
    )
    assert types(out) == ["conversation.item.created"]
    assert only(out, "conversation.item.created")["item"]["content"] == [{"type": "text", "text": "hi"}]


def test_retrieve_and_delete() -> None:
    d = Driver()
    d.send(
        {
            "type": "conversation.item.create",
            "item": {
                "id": "aud",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": b64(tone(200))}],
            },
        }
    )
    retrieved = only(d.send({"type": "conversation.item.retrieve", "item_id": "aud"}), "conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["audio"] == b64(tone(200))
    missing = error(d.send({"type": "conversation.item.retrieve", "item_id": "ghost", "event_id": "rci_ghost"}))
    assert missing["code"] == "item_retrieve_invalid_item_id" and missing["event_id"] == "rci_ghost"
    assert (
        only(d.send({"type": "conversation.item.delete", "item_id": "aud"}), "conversation.item.deleted")["item_id"]
        == "aud"
    )
    assert len(d.session.items) == 0
    assert (
        error(d.send({"type": "conversation.item.delete", "item_id": "aud"}))["code"] == "item_delete_invalid_item_id"
    )


def test_created_items_never_carry_audio_bytes() -> None:
    d = Driver()
    added = only(
        d.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_audio", "audio": b64(tone(200)), "transcript": "hi"}],
                },
            }
        ),
        "conversation.item.added",
    )
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": "hi"}]
