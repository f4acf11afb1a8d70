"""Response lifecycle: the event order real clients rely on, indices, usage, cancel, overrides, tools."""

from __future__ import annotations

import base64

from omni_gateway.omni.protocol import AudioChunk, Done, Error, TextDelta, ToolCallDelta, Usage

from tests.harness.fake_backend import tone
from tests.harness.session_driver import Driver, cancelled, error, events, only, started, types

TEXT_ORDER = [
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def test_ga_text_turn_order_indices_and_usage() -> None:
    d = Driver()
    d.text_mode()
    d.text_item("hi", id="u1")
    created = d.send({"type": "response.create"})
    assert types(created) == ["response.created"]
    response = only(created, "response.created")["response"]
    assert response["status"] == "in_progress" and response["output"] == []
    assert response["object"] == "realtime.response" and response["conversation_id"].startswith("conv_")
    rid = started(created)
    out = d.run(
        rid,
        [TextDelta("Hi "), TextDelta("there"), Usage(input_tokens=7, output_tokens=2, cached_tokens=3), Done("stop")],
    )
    assert types(out) == TEXT_ORDER
    evs = events(out)
    assert evs[1]["previous_item_id"] == "u1"
    item_id = evs[0]["item"]["id"]
    for ev in evs[2:7]:
        assert (ev["response_id"], ev["item_id"], ev["output_index"], ev["content_index"]) == (rid, item_id, 0, 0)
    assert evs[2]["part"] == {"type": "text", "text": ""}
    assert evs[5]["text"] == "Hi there"
    done = evs[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"] == [{"type": "output_text", "text": "Hi there"}]
    usage = done["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (7, 2, 9)
    assert usage["input_token_details"]["cached_tokens"] == 3
    assert d.session.items.get(item_id) is not None  # the reply joined the conversation


def test_audio_turn_interleaves_transcript_and_audio() -> None:
    d = Driver()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    out = d.run(rid, [AudioChunk(tone(100), 24000, "Hel"), AudioChunk(tone(100), 24000, "lo"), Done("stop")])
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    evs = events(out)
    assert evs[2]["part"] == {"type": "audio", "transcript": ""}
    assert base64.b64decode(evs[4]["delta"]) == tone(100)
    assert evs[8]["transcript"] == "Hello"
    assert evs[-1]["response"]["output"][0]["content"] == [{"type": "output_audio", "transcript": "Hello"}]
    assert evs[-1]["response"]["usage"] is None  # the backend sent none: null, not invented zeros


def test_audio_from_another_rate_is_resampled_to_24k() -> None:
    d = Driver()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    at_12k = tone(200)[:2400]  # 1200 samples: 100 ms at 12 kHz
    out = d.run(rid, [AudioChunk(at_12k, 12000, "x"), Done("stop")])
    delta = base64.b64decode(only(out, "response.output_audio.delta")["delta"])
    assert len(delta) == 2400 * 2  # 100 ms at 24 kHz


def test_beta_turn_uses_beta_names_and_content_types() -> None:
    d = Driver("beta")
    d.text_item()
    rid = started(d.send({"type": "response.create", "response": {"modalities": ["text", "audio"]}}))
    out = d.run(rid, [AudioChunk(tone(100), 24000, "Hi"), Done("stop")])
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "response.audio_transcript.delta",
        "response.audio.delta",
        "response.audio.done",
        "response.audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    response = events(out)[-1]["response"]
    assert response["output"][0]["content"] == [{"type": "audio", "transcript": "Hi"}]
    assert response["modalities"] == ["text", "audio"] and response["output_audio_format"] == "pcm16"


def test_only_one_active_response_per_conversation() -> None:
    d = Driver()
    d.text_item()
    first = started(d.send({"type": "response.create"}))
    err = error(d.send({"type": "response.create", "event_id": "again"}))
    assert err["code"] == "conversation_already_has_active_response" and first in err["message"]
    assert err["event_id"] == "again"
    oob = d.send({"type": "response.create", "response": {"conversation": "none"}})
    assert types(oob) == ["response.created"]  # out-of-band responses may run alongside
    d.run(first)
    assert types(d.send({"type": "response.create"})) == ["response.created"]


def test_cancel_mid_stream_closes_everything_and_ignores_later_chunks() -> None:
    d = Driver()
    d.text_mode()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    d.session.build_request(rid)
    d.session.on_chunk(rid, TextDelta("partial"))
    out = d.send({"type": "response.cancel"})
    assert cancelled(out) == [rid]
    assert types(out) == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    done = events(out)[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "client_cancelled"
    assert done["output"][0]["status"] == "incomplete"
    assert d.session.on_chunk(rid, TextDelta("late")) == []
    assert d.session.on_stream_end(rid) == []
    assert d.session.build_request(rid) is None


def test_cancel_without_active_response() -> None:
    d = Driver()
    err = error(d.send({"type": "response.cancel", "event_id": "c1"}))
    assert err["code"] == "response_cancel_not_active" and err["event_id"] == "c1"
    assert (
        error(d.send({"type": "response.cancel", "response_id": "resp_nope"}))["code"] == "response_cancel_not_active"
    )


def test_out_of_band_response_with_input_metadata_and_overrides() -> None:
    d = Driver()
    d.text_item("in the conversation", id="conv_item")
    out = d.send(
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "metadata": {"topic": "summary"},
                "output_modalities": ["text"],
                "instructions": "Summarise.",
                "max_output_tokens": 12,
                "input": [
                    {"type": "item_reference", "id": "conv_item"},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "extra"}]},
                ],
            },
        }
    )
    created = only(out, "response.created")["response"]
    assert created["metadata"] == {"topic": "summary"} and created["conversation_id"] is None
    rid = started(out)
    request = d.session.build_request(rid)
    assert request is not None
    assert [m.text for m in request.messages] == ["Summarise.", "in the conversation", "extra"]
    assert request.modalities == ("text",) and request.sampling.max_tokens == 12
    result = d.run(rid, [TextDelta("ok"), Done("stop")])
    assert "conversation.item.added" not in types(result)
    assert only(result, "response.done")["response"]["metadata"] == {"topic": "summary"}
    assert [it.id for it in d.session.items] == ["conv_item"]
    # the session itself is untouched by per-response overrides
    assert d.session.settings.instructions == "" and d.session.settings.output_modalities == ("audio",)


def test_response_request_carries_conversation_and_session_settings() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "instructions": "Be kind.",
                "audio": {"output": {"voice": "verse", "speed": 1.25}},
            },
        }
    )
    d.text_item("question")
    request = d.session.build_request(started(d.send({"type": "response.create"})))
    assert request is not None
    assert [(m.role, m.text) for m in request.messages] == [("system", "Be kind."), ("user", "question")]
    assert request.modalities == ("text", "audio")
    assert request.audio.voice == "verse" and request.audio.speed == 1.25 and request.audio.sample_rate == 24000
    assert request.sampling.temperature is None  # GA has no temperature: the server's default applies


def test_beta_temperature_reaches_the_request() -> None:
    d = Driver("beta")
    d.send({"type": "session.update", "session": {"temperature": 0.7, "instructions": "Be brief."}})
    request = d.session.build_request(started(d.send({"type": "response.create"})))
    assert request is not None and request.sampling.temperature == 0.7
    override = d.session.build_request(
        started(d.send({"type": "response.create", "response": {"conversation": "none", "temperature": 1.1}}))
    )
    assert override is not None and override.sampling.temperature == 1.1


def test_finish_reasons_map_to_status() -> None:
    d = Driver()
    d.text_mode()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    done = only(d.run(rid, [TextDelta("abc"), Done("length")]), "response.done")["response"]
    assert done["status"] == "incomplete" and done["status_details"]["reason"] == "max_output_tokens"
    rid = started(d.send({"type": "response.create"}))
    failed = only(d.run(rid, [Error("overloaded", "busy", 503)]), "response.done")["response"]
    assert failed["status"] == "failed" and failed["status_details"]["error"]["code"] == "overloaded"
    rid = started(d.send({"type": "response.create"}))
    d.session.build_request(rid)
    broken = only(d.session.on_stream_end(rid, "boom"), "response.done")["response"]
    assert broken["status"] == "failed"


def test_usage_after_done_still_reaches_response_done() -> None:
    d = Driver()
    d.text_mode()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    done = only(d.run(rid, [TextDelta("x"), Done("stop"), Usage(input_tokens=3, output_tokens=1)]), "response.done")
    assert done["response"]["usage"]["total_tokens"] == 4


def test_tool_call_lifecycle_and_round_trip() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["text"],
                "tools": [{"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}],
            },
        }
    )
    d.text_item("what time is it?")
    rid = started(d.send({"type": "response.create"}))
    request = d.session.build_request(rid)
    assert request is not None and request.tools[0]["name"] == "get_time"
    out = d.run(rid, [ToolCallDelta("call_1", "get_time", "{}"), Done("tool_calls")])
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    item = only(out, "response.output_item.done")["item"]
    assert (item["type"], item["call_id"], item["name"], item["arguments"], item["status"]) == (
        "function_call",
        "call_1",
        "get_time",
        "{}",
        "completed",
    )
    answer = d.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
        }
    )
    assert types(answer) == ["conversation.item.added", "conversation.item.done"]
    follow_up = d.session.build_request(started(d.send({"type": "response.create"})))
    assert follow_up is not None
    assert follow_up.messages[-2].tool_calls[0].call_id == "call_1"
    assert follow_up.messages[-1].role == "tool" and follow_up.messages[-1].tool_call_id == "call_1"


def test_audio_output_refused_when_the_backend_cannot_speak() -> None:
    from tests.harness.fake_backend import FakeBackend

    d = Driver(backend=FakeBackend(audio_out=False))
    assert events(d.opened)[0]["session"]["output_modalities"] == ["text"]
    err = error(d.send({"type": "response.create", "response": {"output_modalities": ["audio"]}}))
    assert err["param"] == "response.output_modalities"


def test_metadata_limits() -> None:
    d = Driver()
    err = error(d.send({"type": "response.create", "response": {"metadata": {f"k{i}": "v" for i in range(17)}}}))
    assert err["param"] == "response.metadata"
