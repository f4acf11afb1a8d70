"""The CLI voice client against a live server over the scripted backend: one spoken turn in, the answer saved."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import websockets
from omni_gateway.gateway.config import GatewayConfig

from demos.voice_assistant import Progress, converse, main
from tests.harness.fake_backend import RATE, FakeBackend, tone
from tests.harness.live_server import serve

REPLY = "Paris is the capital."
HEARD = "what is the capital of france"
CHUNK_DELAY_S = 0.05


def question() -> np.ndarray:
    return np.frombuffer(tone(800), dtype="<i2")


def test_converse_saves_the_answer_and_reports_transcripts_and_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = FakeBackend(REPLY, transcript=HEARD, chunk_delay=CHUNK_DELAY_S)
    out = tmp_path / "answer.wav"
    with serve(backend, GatewayConfig(api_key="sk-voice")) as port:
        result = asyncio.run(
            converse(
                f"ws://127.0.0.1:{port}/v1/realtime",
                question(),
                api_key="sk-voice",
                mic=False,
                out=out,
                play=False,
                timeout=30,
                progress=Progress(True),
            )
        )

    assert result["transcript_in"] == HEARD
    assert result["transcript_out"] == REPLY
    # Measured from the end of speech. The reply may be prepared from the pause's transcript while
    # the VAD waits out the silence, so it can come sooner than one chunk of the backend's delay.
    assert 0 <= result["latency_ms"] < 10_000
    answer, rate = sf.read(str(out), dtype="int16")
    words = len(REPLY.split())
    assert rate == RATE and answer.ndim == 1
    assert answer.tobytes() == tone(100) * words  # every audio delta, in order, nothing else
    # The whole question went up: its audio (plus the VAD's padding) reached the transcriber.
    assert len(backend.transcribed) == 1 and len(backend.transcribed[0]) >= len(question().tobytes())
    progress = capsys.readouterr().err
    assert f"you: {HEARD}" in progress and f"assistant: {REPLY}" in progress
    assert f"saved {words * 0.1:.2f}s of audio to {out}" in progress


def test_command_line_resamples_a_stereo_file_and_prints_the_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rate = 16000
    t = np.arange(rate * 8 // 10) / rate
    wave = 0.6 * np.sin(2 * np.pi * 220 * t)
    wav = tmp_path / "question.wav"
    sf.write(str(wav), np.stack([wave, wave], axis=1), rate, subtype="PCM_16")
    backend = FakeBackend(REPLY, transcript=HEARD)
    with serve(backend) as port:
        code = main(
            [
                str(wav),
                "--url",
                f"ws://127.0.0.1:{port}/v1/realtime",
                "--out",
                str(tmp_path / "a.wav"),
                "--quiet",
                "--timeout",
                "30",
            ]
        )

    captured = capsys.readouterr()
    assert code == 0 and captured.err == ""
    result = json.loads(captured.out)
    assert result["transcript_in"] == HEARD and result["transcript_out"] == REPLY
    assert result["latency_ms"] is not None
    sent = len(backend.transcribed[0]) / 2 / RATE  # the server saw 24 kHz audio about as long as the file
    assert 0.7 <= sent <= 1.6, sent


def test_a_wrong_key_fails_the_handshake_instead_of_waiting(tmp_path: Path) -> None:
    with (
        serve(FakeBackend(), GatewayConfig(api_key="sk-voice")) as port,
        pytest.raises(websockets.exceptions.InvalidStatus) as failure,
    ):
        asyncio.run(
            converse(
                f"ws://127.0.0.1:{port}/v1/realtime",
                question(),
                api_key="sk-wrong",
                mic=False,
                out=tmp_path / "never.wav",
                play=False,
                timeout=30,
                progress=Progress(False),
            )
        )
    assert failure.value.response.status_code == 401
    assert not (tmp_path / "never.wav").exists()


def test_command_line_explains_an_unreachable_server_and_a_refused_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wav = tmp_path / "question.wav"
    sf.write(str(wav), question(), RATE, subtype="PCM_16")
    with serve(FakeBackend(), GatewayConfig(api_key="sk-voice")) as port:
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        assert main([str(wav), "--url", url, "--api-key", "sk-wrong", "--quiet"]) == 1
    assert "HTTP 401 (wrong or missing --api-key)" in capsys.readouterr().err
    # The server is gone now: nothing listens on that port.
    assert main([str(wav), "--url", url, "--quiet"]) == 1
    assert "is `omni serve` running?" in capsys.readouterr().err


def test_command_line_gives_up_after_its_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wav = tmp_path / "question.wav"
    sf.write(str(wav), question(), RATE, subtype="PCM_16")
    backend = FakeBackend()
    backend.gate = asyncio.Event()  # never set: the answer never starts
    with serve(backend) as port:
        code = main([str(wav), "--url", f"ws://127.0.0.1:{port}/v1/realtime", "--quiet", "--timeout", "4"])
    assert code == 1 and "no complete answer within 4 s" in capsys.readouterr().err
    assert len(backend.requests) == 1  # the turn did reach the model
