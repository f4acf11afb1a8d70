"""A model that hears a turn while it is spoken gets the reply's prompt prefilled with the speech so far."""

from __future__ import annotations

import dataclasses

from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import CancelTask, Prefill, SessionLimits
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.protocol import AudioPart

from tests.harness.fake_backend import FakeBackend, silence
from tests.harness.session_driver import b64, generations, prefill_session, prefills, speak, transcribes


def _backend(while_spoken: bool = True) -> FakeBackend:
    backend = FakeBackend()
    backend.capabilities = dataclasses.replace(backend.capabilities, hears_audio=True, hears_while_spoken=while_spoken)
    return backend


def _heard(work: Prefill) -> AudioPart:
    (part,) = work.request.messages[-1].parts
    assert isinstance(part, AudioPart)
    return part


def test_each_second_of_speech_prefills_the_reply_with_the_speech_so_far() -> None:
    session = prefill_session(_backend(), transcribe=False)
    first = prefills(speak(session, 1500))
    second = prefills(speak(session, 1000))
    assert len(first) == len(second) == 1
    (task_id, early), (again_id, later) = first[0], second[0]
    assert task_id.endswith(":prefill") and again_id == task_id  # a later prefill replaces the earlier one
    assert early.request.messages[0].text == "Be brief." and early.request.messages[-1].role == "user"
    early_audio, later_audio = _heard(early), _heard(later)
    assert early_audio.partial and later_audio.partial and early_audio.transcript is None
    assert audio_fmt.duration_ms(early_audio.pcm16) >= 1000
    assert audio_fmt.duration_ms(later_audio.pcm16) - audio_fmt.duration_ms(early_audio.pcm16) >= 1000
    assert bytes(later_audio.pcm16).startswith(bytes(early_audio.pcm16))


def test_the_turn_end_cancels_the_prefill_and_the_reply_hears_the_whole_turn() -> None:
    session = prefill_session(_backend(), transcribe=False)
    ((task_id, work),) = prefills(speak(session, 1500))
    out = speak(session, 700) + session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(400))})
    assert CancelTask(task_id) in out
    assert not prefills(out[out.index(CancelTask(task_id)) :])  # none starts after the turn's end
    (reply,) = generations(out)
    prefilled, whole = _heard(work), reply.request.messages[-1].parts[0]
    assert isinstance(whole, AudioPart) and not whole.partial
    assert bytes(whole.pcm16).startswith(bytes(prefilled.pcm16)) and len(whole.pcm16) > len(prefilled.pcm16)
    assert reply.request.messages[:-1] == work.request.messages[:-1]
    assert reply.request.sampling == work.request.sampling and reply.request.tools == work.request.tools


def test_input_transcription_still_reads_the_turn_alongside() -> None:
    session = prefill_session(_backend())
    out = speak(session, 1500)
    assert len(prefills(out)) == 1 and len(transcribes(out, partial=True)) == 1


def test_no_prefill_for_a_tower_that_hears_only_whole_clips_when_off_or_when_turns_get_no_reply() -> None:
    assert prefills(speak(prefill_session(_backend(while_spoken=False), transcribe=False), 2500)) == []
    assert prefills(speak(prefill_session(_backend(), prefill=False, transcribe=False), 2500)) == []
    assert prefills(speak(prefill_session(_backend(), create_response=False, transcribe=False), 2500)) == []
    off = dataclasses.replace(SessionLimits(), partial_transcript_ms=None)
    session = RealtimeSession(
        dialect="ga", capabilities=_backend().capabilities, vad_factory=FakeBackend().new_vad, limits=off
    )
    session.open()
    turn = {"type": "server_vad", "silence_duration_ms": 300}
    session.receive(
        {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": turn}}}}
    )
    assert prefills(speak(session, 2500)) == []
