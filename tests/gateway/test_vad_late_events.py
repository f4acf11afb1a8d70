"""Server VAD whose detector judges off the event loop (batched across sessions): its events reach the session
through ``listen`` and act exactly as events returned with the audio would."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable
from typing import Any

from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.protocol import VadEvent, VadSettings
from websockets.asyncio.client import connect

from tests.harness.fake_backend import AmplitudeVad, FakeBackend, silence, tone
from tests.harness.live_server import serve, until
from tests.harness.session_driver import Driver, b64, events, types

SERVER_VAD = {
    "type": "session.update",
    "session": {
        "type": "realtime",
        "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}},
    },
}
LISTEN_ONLY = json.loads(json.dumps(SERVER_VAD))
LISTEN_ONLY["session"]["audio"]["input"]["turn_detection"]["create_response"] = False


class LateVad:
    """The amplitude VAD, holding its events until ``release``: a detector whose verdicts come later."""

    def __init__(self, settings: VadSettings) -> None:
        self._inner = AmplitudeVad(settings)
        self._held: list[VadEvent] = []
        self._ready: list[VadEvent] = []
        self._notify: Callable[[], None] | None = None

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        self._held += self._inner.feed(pcm16)
        ready, self._ready = self._ready, []
        return ready

    def reset(self) -> None:
        self._inner.reset()
        self._held, self._ready = [], []

    def listen(self, notify: Callable[[], None]) -> None:
        self._notify = notify

    def release(self) -> None:
        self._ready += self._held
        self._held = []
        assert self._notify is not None
        self._notify()


def turn(d: Driver) -> list[Any]:
    out = []
    for chunk in (silence(100), tone(300), silence(300)):
        out += d.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})
    return out


def test_late_events_yield_the_same_turn_as_events_returned_with_the_audio() -> None:
    inline = Driver()
    inline.send(SERVER_VAD)
    expected = turn(inline)

    backend = FakeBackend()
    detectors: list[LateVad] = []

    def factory(settings: VadSettings) -> LateVad:
        detectors.append(LateVad(settings))
        return detectors[-1]

    late = Driver(backend=backend)
    late.session = RealtimeSession(dialect="ga", capabilities=backend.capabilities, vad_factory=factory)  # type: ignore[arg-type]
    late.send(SERVER_VAD)
    detector = detectors[-1]
    detector.listen(lambda: None)  # what the connection does; the test pulls the events itself below
    assert "input_audio_buffer.speech_started" not in types(turn(late))
    detector.release()
    got = late.session.on_vad_events()

    def shape(out: list[Any]) -> list[tuple[str, Any, Any]]:
        return [(e["type"], e.get("audio_start_ms"), e.get("audio_end_ms")) for e in events(out)]

    assert shape(got) == shape(expected)
    assert "input_audio_buffer.speech_stopped" in types(got)
    assert late.session.on_vad_events() == []  # each event acts once


def test_a_detector_notifying_from_its_thread_reaches_the_client_without_more_audio() -> None:
    detectors: list[LateVad] = []

    class Backend(FakeBackend):
        def new_vad(self, settings: VadSettings) -> LateVad:  # type: ignore[override]
            detectors.append(LateVad(settings))
            return detectors[-1]

    async def go(port: int) -> list[dict[str, Any]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=omni-test") as ws:
            await ws.send(json.dumps(LISTEN_ONLY))
            await until(ws, "session.updated")

            for chunk in (silence(100), tone(300), silence(300)):
                audio = base64.b64encode(chunk).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            await asyncio.sleep(0.2)  # the server has read the audio; the detector still holds its verdicts
            threading.Thread(target=detectors[-1].release).start()
            return await until(ws, "input_audio_buffer.speech_stopped")

    with serve(Backend()) as port:
        seen = asyncio.run(asyncio.wait_for(go(port), 15))
    kinds = [e["type"] for e in seen]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped")
