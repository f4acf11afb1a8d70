"""Partial transcripts while the user speaks: ``conversation.item.input_audio_transcription.delta``."""

from __future__ import annotations

import pytest
from omni_gateway.gateway.realtime.commands import SessionLimits
from omni_gateway.gateway.realtime.partial_transcript import PartialTranscripts, partial_task_id
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.protocol import Transcription
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from tests.harness.fake_backend import FakeBackend, silence
from tests.harness.session_driver import b64, events, speak, transcribes, types

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


def _session(transcription: bool = True, every_ms: int | None = 1000, prefill: bool = False) -> RealtimeSession:
    backend = FakeBackend()
    session = RealtimeSession(
        dialect="ga",
        capabilities=backend.capabilities,
        vad_factory=backend.new_vad,
        limits=SessionLimits(partial_transcript_ms=every_ms, prefill_while_speaking=prefill),
    )
    session.open()
    audio_input: dict = {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}
    if transcription:
        audio_input["transcription"] = {"model": "whisper-1"}
    session.receive({"type": "session.update", "session": {"type": "realtime", "audio": {"input": audio_input}}})
    return session


def _deltas(outputs: list) -> list[str]:
    return [e["delta"] for e in events(outputs) if e["type"] == DELTA]


def test_speech_is_read_every_second_while_the_previous_reading_is_not_running() -> None:
    session = _session()
    out = speak(session, 2500)
    (job,) = transcribes(out, partial=True)  # the second second found the first reading still running
    assert job.partial and 1000 <= len(job.pcm16) // 48 < 1200
    out = session.on_partial_transcription(partial_task_id(job.item_id), Transcription("I would"))
    assert _deltas(out) == []  # one reading: nothing agreed on yet
    (second,) = transcribes(speak(session, 100), partial=True)
    assert second.item_id == job.item_id and len(second.pcm16) > len(job.pcm16)


def test_deltas_send_the_words_two_readings_agree_on_and_the_final_sends_the_rest() -> None:
    session = _session()
    (job,) = transcribes(speak(session, 1000), partial=True)
    task = partial_task_id(job.item_id)
    session.on_partial_transcription(task, Transcription("I would like a"))
    speak(session, 1000)
    out = session.on_partial_transcription(task, Transcription("I would like to book"))
    (delta,) = _deltas(out)
    assert delta == "I would like"
    TypeAdapter(RealtimeServerEvent).validate_python(events(out)[0])
    speak(session, 1000)
    assert _deltas(session.on_partial_transcription(task, Transcription("I would like to book a"))) == [" to book"]
    stop = session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(600))})
    (final,) = transcribes(stop)
    assert final.item_id == job.item_id and not final.partial
    out = session.on_transcription(job.item_id, Transcription("I would like to book a table."))
    assert types(out)[:2] == [DELTA, COMPLETED]
    assert _deltas(out) == [" a table."]
    sent = "I would like" + " to book" + " a table."
    assert events(out)[1]["transcript"] == sent


def test_a_reading_that_takes_words_back_sends_nothing_and_the_final_corrects() -> None:
    session = _session()
    (job,) = transcribes(speak(session, 1000), partial=True)
    task = partial_task_id(job.item_id)
    session.on_partial_transcription(task, Transcription("Eye would"))
    speak(session, 1000)
    assert _deltas(session.on_partial_transcription(task, Transcription("Eye would like"))) == ["Eye would"]
    speak(session, 1000)
    assert _deltas(session.on_partial_transcription(task, Transcription("I would like to"))) == []
    session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(600))})
    out = session.on_transcription(job.item_id, Transcription("I would like to go."))
    assert types(out)[0] == COMPLETED and _deltas(out) == []


def test_a_skipped_reading_lets_the_next_second_try_again() -> None:
    session = _session()
    (job,) = transcribes(speak(session, 1000), partial=True)
    assert transcribes(speak(session, 1000), partial=True) == []
    session.on_partial_transcription(partial_task_id(job.item_id), None)
    assert len(transcribes(speak(session, 100), partial=True)) == 1


def test_no_partial_readings_without_transcription_or_prefill_or_with_the_cadence_off() -> None:
    assert transcribes(speak(_session(transcription=False), 3000), partial=True) == []
    assert transcribes(speak(_session(every_ms=None), 3000), partial=True) == []
    assert transcribes(speak(_session(transcription=False, prefill=True), 3000), partial=True) == []


def test_no_reading_during_a_pause() -> None:
    session = _session()
    (job,) = transcribes(speak(session, 1000), partial=True)
    session.on_partial_transcription(partial_task_id(job.item_id), None)
    out = session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(200))})
    assert transcribes(out, partial=True) == []


def test_a_late_reading_after_the_final_transcript_is_ignored() -> None:
    session = _session()
    (job,) = transcribes(speak(session, 1000), partial=True)
    session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(600))})
    session.on_transcription(job.item_id, Transcription("Hello there."))
    assert _deltas(session.on_partial_transcription(partial_task_id(job.item_id), Transcription("Hello"))) == []


def test_partial_transcripts_refuse_a_negative_cadence() -> None:
    with pytest.raises(ValueError, match="every_bytes must be >= 0"):
        PartialTranscripts(-1)
