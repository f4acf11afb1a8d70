"""The browser demo end to end: headless Chromium speaks a question into the page's microphone and the page
shows the transcript, the spoken answer's text and its latency, having received the answer's audio.

The real embedded models answer (SmolLM2, Whisper tiny.en, Piper, silero VAD). Chromium's fake capture
device plays a WAV file, spoken by the packaged Piper voice, as the microphone. The screenshot lands in
artifacts/ for a human to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from playwright.sync_api import Page

from tests.demos.chromium_page import connect, demo_page
from tests.harness.live_server import serve

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "artifacts"
QUESTION = "What is the capital of France?"
FAKE_MIC_RATE = 48000  # Chromium's capture rate; the page resamples to 24 kHz in its AudioContext
# The fake device loops its file: the long tail keeps the question from being asked again while the
# answer is generated on a slow CPU (a repeat would barge in and cancel it).
TRAILING_SILENCE_S = 60
ANSWER_TIMEOUT_MS = 240_000


@pytest.fixture(scope="module")
def backend(embedded_backend):
    return embedded_backend


@pytest.fixture(scope="module")
def port(backend) -> Iterator[int]:
    with serve(backend) as bound:
        yield bound


@pytest.fixture(scope="module")
def question_wav(backend, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16-bit mono PCM, as Chromium's fake capture device wants it."""
    speech = soxr.resample(backend.tts.synthesize(QUESTION), 24000, FAKE_MIC_RATE)
    audio = np.concatenate([np.zeros(FAKE_MIC_RATE), speech, np.zeros(TRAILING_SILENCE_S * FAKE_MIC_RATE)])
    path = tmp_path_factory.mktemp("mic") / "question.wav"
    sf.write(str(path), np.clip(audio, -1, 1), FAKE_MIC_RATE, subtype="PCM_16")
    return path


def demo_state(page: Page) -> dict:
    return page.evaluate("""() => ({
        transcripts: window.demo.transcripts, answers: window.demo.answers, responsesDone: window.demo.responsesDone,
        audioBytesReceived: window.demo.audioBytesReceived, micBytesSent: window.demo.micBytesSent,
        status: document.getElementById('status').textContent,
        log: [...document.querySelectorAll('#log .msg')].map((m) => `${m.className}: ${m.textContent}`),
    })""")


def test_spoken_question_in_the_browser_gets_a_spoken_answer(port: int, question_wav: Path) -> None:
    with demo_page(port, question_wav) as (page, problems):
        connect(page)
        page.click("#mic")
        try:
            page.wait_for_function(
                "() => window.demo.responsesDone >= 1 && window.demo.transcripts.length >= 1"
                " && window.demo.audioBytesReceived > 0",
                timeout=ANSWER_TIMEOUT_MS,
            )
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "demo-browser-e2e.png"))
        state = demo_state(page)
        latency_row = page.inner_text("#latency tbody tr:first-child")

    assert not problems, problems
    heard = state["transcripts"][0].lower()
    assert "capital" in heard and "france" in heard, state
    assert "paris" in state["answers"][0].lower(), state
    assert state["audioBytesReceived"] >= 24000, state  # at least half a second of 24 kHz pcm16
    assert state["micBytesSent"] > 0 and state["status"].startswith("connected"), state
    assert not any(line.startswith("msg system") for line in state["log"]), state["log"]
    # The turn's row: the VAD's wait after the speech, then from the turn's end to the transcript, the first
    # text and the first audio, then the answer's length in seconds.
    turn, vad, heard_in, to_text, to_audio, length = latency_row.split("\t")
    assert turn == "1" and all(t.endswith(" ms") for t in (vad, heard_in, to_text, to_audio)), latency_row
    assert 500 <= int(vad.removesuffix(" ms")) < 3000, latency_row  # the session's 500 ms of silence and more
    assert float(length.removesuffix(" s")) == pytest.approx(state["audioBytesReceived"] / 2 / 24000, abs=0.06)
