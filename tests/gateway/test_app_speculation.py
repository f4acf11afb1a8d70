"""Speculative transcription over the socket: the transcript computed during the pause is the one the
committed turn reports and answers from, and the client sees the same events as without it."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from omni_gateway.omni.protocol import Transcription
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend, silence, tone
from tests.harness.live_server import serve, until

TIMEOUT = 15
BYTES_PER_MS = 48


class SlowAsr(FakeBackend):
    """Transcription takes ``delay`` seconds and answers with the byte count it heard; the first
    ``failures`` calls fail."""

    def __init__(self, delay: float = 0.2, failures: int = 0) -> None:
        super().__init__(reply="Sure.")
        self.delay = delay
        self.failures = failures

    async def transcribe(
        self, pcm16: bytes, sample_rate: int, *, language: str | None = None, prompt: str | None = None
    ) -> Transcription:
        self.transcribed.append(pcm16)
        await asyncio.sleep(self.delay)
        if len(self.transcribed) <= self.failures:
            raise RuntimeError("ASR exploded")
        return Transcription(f"{len(pcm16)} bytes", duration_s=len(pcm16) / (2 * sample_rate))


async def converse(port: int, pieces: list[bytes]) -> list[dict[str, Any]]:
    """Speak ``pieces`` with a pause between sends (the server handles each before the next), then
    collect events until the reply is done."""
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=omni-test") as ws:
        await until(ws, "conversation.created")
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "output_modalities": ["text"],
                        "audio": {
                            "input": {
                                "transcription": {"model": "whisper-1"},
                                "turn_detection": {
                                    "type": "server_vad",
                                    "prefix_padding_ms": 0,
                                    "silence_duration_ms": 300,
                                },
                            }
                        },
                    },
                }
            )
        )
        await until(ws, "session.updated")
        for pcm in pieces:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
            await asyncio.sleep(0.05)
        return await until(ws, "response.done")


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def test_the_turn_is_transcribed_once_from_its_pause_and_events_stay_as_before() -> None:
    backend = SlowAsr()
    with serve(backend) as port:
        events = run(converse(port, [tone(400), silence(100), silence(300)]))
    assert backend.transcribed == [tone(400)]  # only the speech, from the pause on nobody asked again
    seen = kinds(events)
    assert (
        seen.index("input_audio_buffer.speech_stopped")
        < seen.index("input_audio_buffer.committed")
        < seen.index("conversation.item.input_audio_transcription.completed")
        < seen.index("response.done")
    )
    assert not any("pause" in kind or "resume" in kind or "specul" in kind for kind in seen)
    (done,) = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert done["transcript"] == f"{400 * BYTES_PER_MS} bytes"
    assert backend.requests[-1].messages[-1].parts[0].transcript == done["transcript"]


def test_resumed_speech_is_transcribed_from_the_last_pause() -> None:
    backend = SlowAsr()
    with serve(backend) as port:
        events = run(converse(port, [tone(300), silence(100), tone(200), silence(100), silence(300)]))
    (done,) = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert done["transcript"] == f"{600 * BYTES_PER_MS} bytes"  # both phrases and the gap between them
    assert backend.transcribed[-1] == tone(300) + silence(100) + tone(200)


def test_a_failed_speculation_falls_back_to_transcribing_the_committed_turn() -> None:
    backend = SlowAsr(failures=1)
    with serve(backend) as port:
        events = run(converse(port, [tone(400), silence(100), silence(300)]))
    assert len(backend.transcribed) == 2 and backend.transcribed[1] == tone(400) + silence(300)
    (done,) = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert done["transcript"] == f"{700 * BYTES_PER_MS} bytes"
    assert "conversation.item.input_audio_transcription.failed" not in kinds(events)


def test_the_reply_prepared_during_the_pause_is_the_one_streamed() -> None:
    backend = SlowAsr(delay=0.02)
    with serve(backend) as port:  # the pause lasts six sends: the transcript and its reply come back within it
        events = run(converse(port, [tone(400), silence(100), *[silence(50)] * 6]))
    (request,) = backend.requests  # generated once, from the pause's transcript, before the turn ended
    (done,) = [e for e in events if e["type"] == "response.done"]
    assert done["response"]["id"] == request.request_id and done["response"]["status"] == "completed"
    assert request.messages[-1].parts[0].transcript == f"{400 * BYTES_PER_MS} bytes"
    seen = kinds(events)
    assert (
        seen.index("input_audio_buffer.speech_stopped")
        < seen.index("response.created")
        < seen.index("conversation.item.input_audio_transcription.completed")
        < seen.index("response.output_text.delta")
    )
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Sure."
    assert backend.aborted == []


def test_speech_resumed_after_the_reply_was_prepared_aborts_it_and_answers_the_whole_turn() -> None:
    backend = SlowAsr(delay=0.02)
    backend.chunk_delay = 0.2  # the prepared reply is still being generated when speech resumes
    with serve(backend) as port:
        events = run(
            converse(
                port, [tone(300), silence(100), silence(50), silence(50), tone(200), silence(100), *[silence(50)] * 6]
            )
        )
    first, second = backend.requests
    assert first.request_id in backend.aborted and first.request_id in backend.closed
    assert first.messages[-1].parts[0].transcript == f"{300 * BYTES_PER_MS} bytes"
    assert second.messages[-1].parts[0].transcript == f"{(300 + 200 + 200) * BYTES_PER_MS} bytes"
    (done,) = [e for e in events if e["type"] == "response.done"]
    assert done["response"]["id"] == second.request_id
