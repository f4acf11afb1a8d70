"""Partial transcripts from a real recognizer: a Piper-spoken turn streamed at the session's 24 kHz through
silero VAD, each partial reading transcribed by the packaged Whisper (faster-whisper) or a torch Whisper."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import numpy as np
import pytest
from omni_gateway.encoders.asr import SpeechRecognizer, load_recognizer
from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.encoders.vad import load_session
from omni_gateway.gateway.realtime.commands import Send, StartTask, Transcribe
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import Transcription

from tests.encoders.test_asr import build_tiny_whisper
from tests.omni.test_pipeline import FakeEngine

pytestmark = pytest.mark.slow
RATE = 24000
CHUNK_MS = 40
SENTENCE = "I would like to book a table for two people tonight, somewhere near the river."


def stream_turn(speak, recognizer: SpeechRecognizer) -> list[dict]:  # type: ignore[no-untyped-def]
    """The events of one spoken turn, every transcription run as soon as it is asked for (the ASR idle)."""
    pipeline = OmniPipeline(
        OmniConfig(), engine=FakeEngine([]), model_name="fake", max_context_tokens=4096, vad_session=load_session()
    )
    detectors: list = []  # type: ignore[type-arg]

    def new_vad(settings):  # type: ignore[no-untyped-def]
        detectors.append(pipeline.new_vad(settings))
        return detectors[-1]

    session = RealtimeSession(dialect="ga", capabilities=pipeline.capabilities, vad_factory=new_vad)
    session.open()
    audio_input = {
        "turn_detection": {"type": "server_vad", "create_response": False},
        "transcription": {"model": "whisper-1"},
    }
    session.receive({"type": "session.update", "session": {"type": "realtime", "audio": {"input": audio_input}}})
    audio, rate = speak(SENTENCE)
    x = np.concatenate([np.zeros(RATE // 2, np.float32), resample(audio, rate, RATE) * 0.6, np.zeros(RATE, np.float32)])
    pcm = float_to_pcm16(x)
    step = RATE * 2 * CHUNK_MS // 1000
    sent: list[dict] = []

    def run(outputs: list) -> None:
        for o in outputs:
            if isinstance(o, Send):
                sent.append(o.event)
            elif isinstance(o, StartTask) and isinstance(o.work, Transcribe):
                job = o.work
                heard = recognizer.transcribe(job.pcm16, sample_rate=job.sample_rate)
                result = Transcription(heard.text, heard.language, heard.duration_s)
                if job.partial:
                    run(session.on_partial_transcription(o.task_id, result))
                else:
                    run(session.on_transcription(o.task_id, result))

    for at in range(0, len(pcm), step):
        run(
            session.receive(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[at : at + step]).decode()}
            )
        )
        # server VAD judges off the caller's thread: as on an idle server streaming in real time, every chunk
        # is judged, and its events applied (as the connection does when told), before the next one arrives
        detector = detectors[-1]  # the session's current one
        deadline = time.monotonic() + 10
        while detector._detector.judging:
            assert time.monotonic() < deadline, "the VAD judged nothing for 10 s"
            time.sleep(0.001)
        run(session.on_vad_events())
    return sent


def test_the_packaged_whisper_streams_the_words_while_they_are_spoken(speak) -> None:  # type: ignore[no-untyped-def]
    sent = stream_turn(speak, load_recognizer("default", device="cpu"))
    kinds = [e["type"] for e in sent]
    stopped = kinds.index("input_audio_buffer.speech_stopped")
    deltas = [e["delta"] for e in sent if e["type"] == "conversation.item.input_audio_transcription.delta"]
    early = [e for e in sent[:stopped] if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert len(early) >= 2, kinds  # words arrived before the turn ended
    (completed,) = [e for e in sent if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert {"book", "table", "people"} <= {w.strip(".,").lower() for w in completed["transcript"].split()}
    assert "".join(deltas) == completed["transcript"]  # the deltas add up to the final transcript


def test_a_torch_whisper_reads_the_turn_while_spoken(speak, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    build_tiny_whisper(tmp_path, multilingual=False)
    recognizer = TorchWhisperRecognizer(tmp_path, device="cpu", max_new_tokens=8)
    readings: list[int] = []
    transcribe = recognizer.transcribe

    def counted(audio, **kwargs):  # type: ignore[no-untyped-def]
        readings.append(len(audio))
        return transcribe(audio, **kwargs)

    recognizer.transcribe = counted  # type: ignore[method-assign]
    sent = stream_turn(speak, recognizer)
    kinds = [e["type"] for e in sent]
    # one reading per second of speech (the packaged voice speaks this in about 4.5 s), then the final one
    assert len(readings) >= 4 and readings[:-1] == sorted(readings[:-1])
    assert kinds.count("conversation.item.input_audio_transcription.completed") == 1
