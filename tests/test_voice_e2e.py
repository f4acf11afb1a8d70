"""The voice loop end to end on the embedded defaults: speech in over /v1/realtime, speech out.

The question is spoken by the packaged Piper voice, streamed in 40 ms chunks with server VAD deciding
the end of the turn; the spoken answer is transcribed back with the packaged Whisper and must say
what a correct answer says.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from demos.voice_assistant import Progress, converse
from tests.harness.live_server import serve

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def backend(embedded_backend):
    return embedded_backend


def test_spoken_question_gets_a_spoken_answer_with_the_right_content(backend, tmp_path: Path) -> None:
    question = backend.tts.synthesize(QUESTION)  # float32 at 24 kHz
    pcm = (np.clip(question, -1, 1) * 32767).astype("<i2")
    silence = np.zeros(24000 // 2, dtype="<i2")  # the speaker pauses before asking
    answer_path = tmp_path / "answer.wav"
    with serve(backend) as port:
        result = asyncio.run(
            converse(
                f"ws://127.0.0.1:{port}/v1/realtime",
                np.concatenate([silence, pcm]),
                api_key=None,
                mic=False,
                out=answer_path,
                play=False,
                timeout=300,
                progress=Progress(False),
            )
        )

    assert "capital" in result["transcript_in"].lower() and "france" in result["transcript_in"].lower()
    assert result["latency_ms"] is not None
    answer, rate = sf.read(str(answer_path), dtype="int16")
    assert rate == 24000 and len(answer) > rate // 2  # at least half a second of speech came back
    heard = asyncio.run(backend.transcribe(answer.tobytes(), rate)).text
    assert "paris" in heard.lower(), (heard, result["transcript_out"])
    assert "paris" in result["transcript_out"].lower()
    deadline = time.monotonic() + 10  # stats are refreshed by the engine loop a few times a second
    while (stats := backend.metrics())["running"] or stats["kv_blocks_used"]:
        assert time.monotonic() < deadline, f"engine still busy after the turn ended: {stats}"
        time.sleep(0.1)


def test_the_serving_process_hands_the_interpreter_to_stage_threads_within_half_a_millisecond(backend) -> None:
    import sys

    from omni_gateway.omni.loading import STAGE_SWITCH_INTERVAL_S

    assert backend is not None  # loaded: the loader set it
    assert sys.getswitchinterval() == pytest.approx(STAGE_SWITCH_INTERVAL_S)
