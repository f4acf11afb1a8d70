"""semantic_vad end to end through a realtime session: the omni pipeline's detector (silero + Smart Turn)
behind the session's turn handling, fed the packaged Piper voice at the session's 24 kHz."""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.encoders.vad import load_session
from omni_gateway.gateway.realtime.commands import Send, StartTask, Transcribe
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import Transcription

from tests.omni.test_pipeline import FakeEngine

pytestmark = pytest.mark.slow
RATE = 24000
CHUNK_MS = 40


def turn_end_delay_ms(speak, text: str, eagerness: str) -> tuple[float, list[str]]:  # type: ignore[no-untyped-def]
    """How long after the speech ends the session reports ``speech_stopped``, and the events it sent."""
    pipeline = OmniPipeline(
        OmniConfig(), engine=FakeEngine([]), model_name="fake", max_context_tokens=4096, vad_session=load_session()
    )
    made: list = []  # type: ignore[type-arg]

    def new_vad(settings):  # type: ignore[no-untyped-def]
        made.append(pipeline.new_vad(settings))
        return made[-1]

    session = RealtimeSession(dialect="ga", capabilities=pipeline.capabilities, vad_factory=new_vad)
    session.open()
    turn = {"type": "semantic_vad", "eagerness": eagerness, "create_response": False}
    session.receive(
        {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": turn}}}}
    )
    audio, rate = speak(text)
    speech = resample(audio, rate, RATE) * 0.6
    x = np.concatenate([np.zeros(RATE // 2, np.float32), speech, np.zeros(RATE * 6, np.float32)])
    speech_end_ms = np.nonzero(np.abs(x) > 0.02)[0][-1] * 1000 / RATE
    pcm = float_to_pcm16(x)
    step = RATE * 2 * CHUNK_MS // 1000
    sent: list[dict] = []

    def take(out: list) -> None:  # type: ignore[type-arg]
        sent.extend(o.event for o in out if isinstance(o, Send))
        for o in out:  # the pause's transcription, as the connection's recognizer would return it
            if isinstance(o, StartTask) and isinstance(o.work, Transcribe) and not o.work.partial:
                take(session.on_transcription(o.task_id, Transcription(text)))

    for at in range(0, len(pcm), step):
        take(
            session.receive(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[at : at + step]).decode()}
            )
        )
        # silero judges off the caller's thread; a live client's audio comes slower than it judges, so each chunk's
        # events come before the next chunk, and the connection hands them over on notify
        while made[-1]._detector._vad.judging:  # type: ignore[attr-defined]
            time.sleep(0.001)
        take(session.on_vad_events())
    deadline = time.monotonic() + 10
    while not any(e["type"] == "input_audio_buffer.speech_stopped" for e in sent) and time.monotonic() < deadline:
        time.sleep(0.01)
        take(session.on_vad_events())
    stops = [e for e in sent if e["type"] == "input_audio_buffer.speech_stopped"]
    assert len(stops) == 1, [e["type"] for e in sent]
    return stops[0]["audio_end_ms"] - speech_end_ms, [e["type"] for e in sent]


def test_an_unfinished_sentence_waits_for_more_and_a_finished_one_ends_at_once(speak) -> None:  # type: ignore[no-untyped-def]
    finished, kinds = turn_end_delay_ms(speak, "I would like to book a table for two people tonight.", "auto")
    unfinished, _ = turn_end_delay_ms(speak, "I would like to book a table for two people and", "auto")
    assert finished < 500 < 3000 < unfinished < 4500, (finished, unfinished)
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed")


def test_high_eagerness_caps_the_wait_lower(speak) -> None:  # type: ignore[no-untyped-def]
    high, _ = turn_end_delay_ms(speak, "I would like to book a table for two people and", "high")
    assert 1500 < high < 2500, high
