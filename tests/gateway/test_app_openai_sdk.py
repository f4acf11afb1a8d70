"""The official ``openai`` SDK against a live server: GA text and audio turns, a VAD turn, the beta client."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.harness.fake_backend import FakeBackend, silence, tone
from tests.harness.live_server import serve

TIMEOUT = 20


@pytest.fixture(scope="module")
def backend() -> FakeBackend:
    return FakeBackend(reply="Hello from the fake model.", transcript="what the user said")


@pytest.fixture(scope="module")
def port(backend: FakeBackend) -> Iterator[int]:
    with serve(backend) as p:
        yield p


def client(port: int) -> AsyncOpenAI:
    return AsyncOpenAI(
        api_key="sk-local", base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1"
    )


async def collect(conn: Any, until: str = "response.done", extra: str | None = None) -> list[Any]:
    """Typed events up to ``until`` (and, when given, until ``extra`` was also seen)."""
    seen: list[Any] = []
    async for event in conn:
        seen.append(event)
        names = {e.type for e in seen}
        if until in names and (extra is None or extra in names):
            return seen


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def test_ga_text_turn(port: int, backend: FakeBackend) -> None:
    async def turn() -> list[Any]:
        async with client(port).realtime.connect(model="omni-test") as conn:
            await conn.session.update(
                session={"type": "realtime", "output_modalities": ["text"], "instructions": "Answer briefly."}
            )
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
            )
            await conn.response.create()
            return await collect(conn)

    events = run(turn())
    names = [e.type for e in events]
    assert names[:3] == ["session.created", "conversation.created", "session.updated"]
    assert names[3:5] == ["conversation.item.added", "conversation.item.done"]
    assert names[-1] == "response.done"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello from the fake model."
    done = events[-1].response
    assert done.status == "completed" and done.output[0].content[0].text == text
    assert done.usage.output_tokens == 5
    request = backend.requests[-1]
    assert [(m.role, m.text) for m in request.messages] == [("system", "Answer briefly."), ("user", "hello")]


def test_ga_audio_turn_with_transcription(port: int, backend: FakeBackend) -> None:
    async def turn() -> list[Any]:
        async with client(port).realtime.connect(model="omni-test") as conn:
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["audio"],
                    "audio": {"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}},
                }
            )
            await conn.input_audio_buffer.append(audio=base64.b64encode(tone(400)).decode())
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            return await collect(conn, extra="conversation.item.input_audio_transcription.completed")

    events = run(turn())
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    transcript = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert transcript.item_id == committed.item_id and transcript.transcript == "what the user said"
    assert transcript.usage.type == "duration" and transcript.usage.seconds == pytest.approx(0.4)
    audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    assert audio == tone(100) * 5
    spoken = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
    assert spoken == "Hello from the fake model."
    done = next(e for e in events if e.type == "response.done").response
    assert done.output[0].content[0].type == "output_audio" and done.output[0].content[0].transcript == spoken
    # the model saw the user's audio together with its transcript
    (part,) = backend.requests[-1].messages[-1].parts
    assert part.pcm16 == tone(400) and part.transcript == "what the user said"  # type: ignore[union-attr]


def test_ga_server_vad_turn(port: int) -> None:
    async def turn() -> list[Any]:
        async with client(port).realtime.connect(model="omni-test") as conn:
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["text"],
                    "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}},
                }
            )
            for piece in (silence(300), tone(300), silence(300)):
                await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
            return await collect(conn)

    names = [e.type for e in run(turn())]
    expected = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.done",
    ]
    assert [n for n in names if n in expected] == expected


def test_beta_text_turn(port: int) -> None:
    async def turn() -> list[Any]:
        async with client(port).beta.realtime.connect(model="omni-test") as conn:
            await conn.session.update(session={"modalities": ["text"]})
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
            )
            await conn.response.create()
            return await collect(conn)

    events = run(turn())
    names = [e.type for e in events]
    assert "conversation.item.created" in names and "conversation.item.added" not in names
    assert "response.text.delta" in names and "response.output_text.delta" not in names
    assert events[0].session.modalities == ["text", "audio"]
    text = "".join(e.delta for e in events if e.type == "response.text.delta")
    assert text == "Hello from the fake model."
    assert events[-1].response.output[0].content[0].type == "text"


def test_ga_unknown_voice_is_an_error_event_and_the_session_goes_on(port: int) -> None:
    async def turn() -> list[Any]:
        async with client(port).realtime.connect(model="omni-test") as conn:
            await conn.session.update(
                event_id="evt_voice", session={"type": "realtime", "audio": {"output": {"voice": "alloy"}}}
            )
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
            )
            await conn.response.create()
            return await collect(conn)

    events = run(turn())
    (error,) = [e for e in events if e.type == "error"]
    assert error.error.event_id == "evt_voice" and error.error.param == "session.audio.output.voice"
    assert "'joe', 'verse'" in error.error.message and "alloy" in error.error.message
    updated = [e.session for e in events if e.type == "session.updated"]
    assert len(updated) == 1 and updated[0].audio.output.voice == "joe"
    assert events[-1].type == "response.done" and events[-1].response.status == "completed"


def test_ga_barge_in_cancels_the_running_response() -> None:
    backend = FakeBackend(chunk_delay=1.0)  # slow enough that the reply is still running when the user talks

    async def turn(port: int) -> list[Any]:
        async with client(port).realtime.connect(model="omni-test") as conn:
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}},
                }
            )
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "talk"}]}
            )
            await conn.response.create()
            seen = []
            async for event in conn:
                seen.append(event)
                if event.type == "response.output_audio.delta":
                    break  # the reply is playing: the user talks over it
            await conn.input_audio_buffer.append(audio=base64.b64encode(tone(200)).decode())
            return seen + await collect(conn)

    with serve(backend) as port:
        events = run(turn(port))
        names = [e.type for e in events]
        assert names.index("input_audio_buffer.speech_started") < names.index("response.done")
        done = next(e for e in events if e.type == "response.done").response
        assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
        assert done.output[0].status == "incomplete"
        deadline = time.monotonic() + TIMEOUT  # the abort lands on the server shortly after the cancel
        while not backend.aborted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert backend.aborted == [done.id]
