"""Drives a ``RealtimeSession`` without sockets: client events in, server events and commands out."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

from omni_gateway.gateway.realtime.commands import (
    AsrDeadline,
    CancelTask,
    Generate,
    Output,
    Prefill,
    Send,
    SessionLimits,
    StartTask,
    Transcribe,
)
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.gateway.realtime.voice_timing import VoiceObserver
from omni_gateway.omni.protocol import OutputChunk

from tests.harness.fake_backend import FakeBackend, tone


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Driver:
    def __init__(
        self,
        dialect: str = "ga",
        backend: FakeBackend | None = None,
        vad: bool = True,
        limits: SessionLimits | None = None,
        count_tokens: bool = False,
        now: Callable[[], float] = time.time,
        voice: VoiceObserver | None = None,
    ) -> None:
        self.backend = backend or FakeBackend(vad=vad)
        self.session = RealtimeSession(
            dialect=dialect,
            capabilities=self.backend.capabilities,  # type: ignore[arg-type]
            vad_factory=self.backend.new_vad if vad else None,
            limits=limits,
            now=now,
            count_tokens=self.backend.count_tokens if count_tokens else None,
            voice=voice,
        )
        self.opened = self.session.open()

    def send(self, event: dict[str, Any]) -> list[Output]:
        return self.session.receive(event)

    def run(self, response_id: str, chunks: list[OutputChunk] | None = None) -> list[Output]:
        """Stream the fake backend's answer (or ``chunks``) through the session, ending the stream."""
        request = self.session.build_request(response_id)
        assert request is not None, "response was not running"
        out: list[Output] = []
        for chunk in chunks if chunks is not None else self.backend.chunks(request):
            out += self.session.on_chunk(response_id, chunk)
        return out + self.session.on_stream_end(response_id)

    def text_item(self, text: str = "hello", **extra: Any) -> list[Output]:
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}], **extra}
        return self.send({"type": "conversation.item.create", "item": item})

    def text_mode(self) -> None:
        session = (
            {"type": "realtime", "output_modalities": ["text"]}
            if self.session.dialect == "ga"
            else {"modalities": ["text"]}
        )
        assert types(self.send({"type": "session.update", "session": session})) == ["session.updated"]


def events(outputs: list[Output]) -> list[dict[str, Any]]:
    return [o.event for o in outputs if isinstance(o, Send)]


def types(outputs: list[Output]) -> list[str]:
    return [e["type"] for e in events(outputs)]


def only(outputs: list[Output], kind: str) -> dict[str, Any]:
    found = [e for e in events(outputs) if e["type"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {types(outputs)}"
    return found[0]


def generations(outputs: list[Output]) -> list[Generate]:
    return [o.work for o in outputs if isinstance(o, StartTask) and isinstance(o.work, Generate)]


def responses_started(outputs: list[Output]) -> list[str]:
    """The responses ``outputs`` start: generating now, or once the transcripts they wait for are in."""
    return [
        o.work.request.request_id if isinstance(o.work, Generate) else o.work.response_id
        for o in outputs
        if isinstance(o, StartTask) and isinstance(o.work, (Generate, AsrDeadline))
    ]


def started(outputs: list[Output]) -> str:
    ids = responses_started(outputs)
    assert len(ids) == 1, f"expected one response started in {outputs!r:.300}"
    return ids[0]


def cancelled(outputs: list[Output]) -> list[str]:
    return [o.task_id for o in outputs if isinstance(o, CancelTask)]


def transcribes(outputs: list[Output], *, partial: bool = False) -> list[Transcribe]:
    """The transcription tasks started: of turns (or, with ``partial``, of turns being spoken)."""
    return [
        o.work
        for o in outputs
        if isinstance(o, StartTask) and isinstance(o.work, Transcribe) and o.work.partial == partial
    ]


def committed_jobs(outputs: list[Output]) -> list[Transcribe]:
    """The transcription task of each turn (its item id is the task's): the last one started for it."""
    return list({job.item_id: job for job in transcribes(outputs)}.values())


def error(outputs: list[Output]) -> dict[str, Any]:
    return only(outputs, "error")["error"]


def prefill_session(
    backend: FakeBackend, *, prefill: bool = True, create_response: bool = True, transcribe: bool = True
) -> RealtimeSession:
    """A GA session under server VAD (300 ms of silence ends a turn) with partial readings every second and
    prefill while speaking as asked, over ``backend``'s capabilities and VAD."""
    session = RealtimeSession(
        dialect="ga",
        capabilities=backend.capabilities,
        vad_factory=backend.new_vad,
        limits=SessionLimits(partial_transcript_ms=1000, prefill_while_speaking=prefill),
    )
    session.open()
    turn = {"type": "server_vad", "silence_duration_ms": 300, "create_response": create_response}
    audio_input = {"turn_detection": turn, **({"transcription": {"model": "whisper-1"}} if transcribe else {})}
    session.receive(
        {
            "type": "session.update",
            "session": {"type": "realtime", "instructions": "Be brief.", "audio": {"input": audio_input}},
        }
    )
    return session


def speak(session: RealtimeSession, ms: int) -> list[Output]:
    """``ms`` of speech in 100 ms appends, as a client streams it."""
    out: list[Output] = []
    for _ in range(ms // 100):
        out += session.receive({"type": "input_audio_buffer.append", "audio": b64(tone(100))})
    return out


def prefills(outputs: list[Output]) -> list[tuple[str, Prefill]]:
    """The prefill tasks started: (task id, work)."""
    return [(o.task_id, o.work) for o in outputs if isinstance(o, StartTask) and isinstance(o.work, Prefill)]
