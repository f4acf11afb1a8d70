"""A cascade prefills the reply of a turn still being spoken from each partial transcript of it."""

from __future__ import annotations

import asyncio
import dataclasses

from omni_gateway.gateway.realtime.commands import CancelTask, SessionLimits
from omni_gateway.gateway.realtime.partial_transcript import partial_task_id
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.gateway.realtime.tasks import run_task
from omni_gateway.omni.protocol import Transcription

from tests.harness.fake_backend import FakeBackend, silence
from tests.harness.session_driver import b64, generations, prefill_session, prefills, speak, transcribes


def _read(session: RealtimeSession, text: str, ms: int = 1000) -> list:
    """Speak ``ms`` more, then answer the partial reading it started with ``text``."""
    (job,) = transcribes(speak(session, ms), partial=True)
    return session.on_partial_transcription(partial_task_id(job.item_id), Transcription(text))


def test_each_partial_reading_prefills_the_reply_the_turn_would_get() -> None:
    session = prefill_session(FakeBackend())
    ((task_id, work),) = prefills(_read(session, "What is the"))
    assert task_id.endswith(":prefill")
    messages = work.request.messages
    assert messages[0].role == "system" and messages[0].text == "Be brief."
    assert messages[-1].role == "user" and messages[-1].text == "What is the"
    ((again_id, again),) = prefills(_read(session, "What is the capital of"))
    assert again_id == task_id and again.request.messages[-1].text == "What is the capital of"  # replaces the first


def test_the_prefilled_prompt_is_the_reply_prompt_up_to_the_words_heard() -> None:
    session = prefill_session(FakeBackend())
    ((_, work),) = prefills(_read(session, "What is the capital"))
    out = session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(400))})
    ((job,),) = [transcribes(out)]
    out = session.on_transcription(job.item_id, Transcription("What is the capital of France?"))
    (reply,) = generations(out)
    assert reply.request.messages[:-1] == work.request.messages[:-1]
    assert reply.request.messages[-1].text.startswith(work.request.messages[-1].text)
    assert reply.request.sampling == work.request.sampling and reply.request.tools == work.request.tools


def test_the_turn_end_cancels_a_prefill_still_running() -> None:
    session = prefill_session(FakeBackend())
    ((task_id, _),) = prefills(_read(session, "What is"))
    out = session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(400))})
    assert CancelTask(task_id) in out


def test_no_prefill_when_switched_off_when_turns_get_no_reply_or_for_blank_or_late_readings() -> None:
    off = prefill_session(FakeBackend(), prefill=False)
    assert prefills(_read(off, "What is the")) == []
    silent = prefill_session(FakeBackend(), create_response=False)
    assert prefills(_read(silent, "What is the")) == []
    session = prefill_session(FakeBackend())
    assert prefills(_read(session, "  ")) == []
    (job,) = transcribes(speak(session, 1000), partial=True)
    session.receive({"type": "input_audio_buffer.append", "audio": b64(silence(400))})  # committed meanwhile
    assert prefills(session.on_partial_transcription(partial_task_id(job.item_id), Transcription("Hi"))) == []


def test_no_prefill_for_a_model_that_hears_the_audio_itself() -> None:
    backend = FakeBackend()
    backend.capabilities = dataclasses.replace(backend.capabilities, hears_audio=True)
    session = prefill_session(backend)
    assert prefills(_read(session, "What is the")) == []


def test_no_reading_runs_for_a_prefill_alone() -> None:
    session = RealtimeSession(
        dialect="ga",
        capabilities=FakeBackend().capabilities,
        vad_factory=FakeBackend().new_vad,
        limits=SessionLimits(partial_transcript_ms=1000, prefill_while_speaking=True),
    )
    session.open()
    turn = {"type": "server_vad", "silence_duration_ms": 300}
    session.receive(
        {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": turn}}}}
    )
    assert transcribes(speak(session, 2000), partial=True) == []  # the client asked for no transcription


def test_a_prefill_runs_the_prompt_as_a_one_token_text_answer_and_reports_nothing() -> None:
    backend = FakeBackend()
    session = prefill_session(backend)
    ((task_id, work),) = prefills(_read(session, "What is the"))
    reported: list = []

    async def report(outputs: list) -> None:
        reported.append(outputs)

    asyncio.run(run_task(backend, session, task_id, work, report))
    (sent,) = backend.requests
    assert sent.prefill_only and sent.modalities == work.request.modalities
    assert sent.sampling.max_tokens == 1 and sent.session_id == session.id
    assert sent.messages == work.request.messages
    assert backend.completed == [sent.request_id] and reported == []
