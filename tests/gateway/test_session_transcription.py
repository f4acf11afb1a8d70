"""Transcription sessions: GA ``type: "transcription"`` / ``?intent=transcription`` and beta
``transcription_session.update``: turns are committed and transcribed, never answered."""

from __future__ import annotations

from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.protocol import Transcription
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from tests.harness.fake_backend import FakeBackend, silence, tone
from tests.harness.session_driver import Driver, b64, committed_jobs, error, events, only, transcribes, types

VAD = {"type": "server_vad", "silence_duration_ms": 200}


def test_ga_transcription_session_transcribes_turns_without_responding() -> None:
    d = Driver()
    updated = only(
        d.send(
            {
                "type": "session.update",
                "session": {
                    "type": "transcription",
                    "audio": {
                        "input": {"transcription": {"model": "whisper-1", "language": "en"}, "turn_detection": VAD}
                    },
                },
            }
        ),
        "session.updated",
    )
    assert updated["session"]["type"] == "transcription"
    TypeAdapter(RealtimeServerEvent).validate_python(updated)
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(silence(200) + tone(300) + silence(300))})
    assert types(out) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    (job,) = committed_jobs(out)
    assert job.language == "en"
    done = only(
        d.session.on_transcription(job.item_id, Transcription("hello")),
        "conversation.item.input_audio_transcription.completed",
    )
    assert done["transcript"] == "hello"
    assert error(d.send({"type": "response.create"}))["param"] == "session.type"


def test_intent_transcription_starts_as_a_transcription_session_with_default_reporting() -> None:
    backend = FakeBackend()
    session = RealtimeSession(
        dialect="ga", capabilities=backend.capabilities, vad_factory=backend.new_vad, intent="transcription"
    )
    created = events(session.open())[0]
    assert created["session"]["type"] == "transcription"
    TypeAdapter(RealtimeServerEvent).validate_python(created)
    session.receive(
        {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"turn_detection": None}}}}
    )
    session.receive({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    (job,) = transcribes(session.receive({"type": "input_audio_buffer.commit"}))
    # no transcription model configured: a transcription session still reports what it heard
    assert types(session.on_transcription(job.item_id, Transcription("hi"))) == [
        "conversation.item.input_audio_transcription.completed"
    ]


def test_beta_transcription_session_update() -> None:
    d = Driver("beta")
    out = d.send(
        {
            "type": "transcription_session.update",
            "session": {
                "input_audio_format": "g711_ulaw",
                "input_audio_transcription": {"model": "whisper-1"},
                "turn_detection": VAD,
                "modalities": ["text"],
            },
        }
    )
    session = only(out, "transcription_session.updated")["session"]
    assert session["object"] == "realtime.transcription_session"
    assert session["input_audio_format"] == "g711_ulaw" and session["turn_detection"]["silence_duration_ms"] == 200
    assert d.session.settings.kind == "transcription"
    assert (
        error(Driver("ga").send({"type": "transcription_session.update", "session": {}}))["code"] == "invalid_event"
    )  # GA clients use session.update with type "transcription"
