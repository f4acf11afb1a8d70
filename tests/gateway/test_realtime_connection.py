"""The asyncio shell around a realtime session, over a stand-in socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.connection import RealtimeConnection
from omni_gateway.omni.protocol import AudioChunk, Done
from starlette.websockets import WebSocketState

from tests.harness.fake_backend import FakeBackend, tone


class StandInSocket:
    """Takes the client's frames from a queue; records each frame sent with the turns another task has had.
    Its first send waits until ``backlog`` holds, the rest return at once."""

    def __init__(self, turns: list[int], backlog: asyncio.Event) -> None:
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[tuple[int, dict[str, Any]]] = []
        self.turns = turns
        self.backlog = backlog
        self.application_state = self.client_state = WebSocketState.CONNECTED

    async def receive(self) -> dict[str, Any]:
        return await self.frames.get()

    async def send_text(self, text: str) -> None:
        if not self.sent:
            await self.backlog.wait()
        self.sent.append((self.turns[0], json.loads(text)))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.application_state = WebSocketState.DISCONNECTED


def test_a_backlog_of_events_goes_out_with_other_tasks_running_between_the_sends() -> None:
    backend = FakeBackend(script=[*(AudioChunk(tone(100), 24000) for _ in range(40)), Done("stop")])

    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        turns = [0]

        async def other_task() -> None:
            while True:
                turns[0] += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_task())
        backlog = asyncio.Event()
        ws = StandInSocket(turns, backlog)
        connection = RealtimeConnection(ws, backend, GatewayConfig(), "ga", None)  # type: ignore[arg-type]
        running = asyncio.create_task(connection.run())
        create = {"type": "response.create", "response": {"instructions": "Talk."}}
        await ws.frames.put({"type": "websocket.receive", "text": json.dumps(create)})
        while len(backend.completed) < 1:  # the whole reply waits in the outbox
            await asyncio.sleep(0.01)
        backlog.set()
        while not any(event["type"] == "response.done" for _, event in ws.sent):
            await asyncio.sleep(0.01)
        await ws.frames.put({"type": "websocket.disconnect"})
        await running
        other.cancel()
        return ws.sent

    sent = asyncio.run(asyncio.wait_for(scenario(), 10))
    deltas = [turns for turns, event in sent if event["type"] == "response.output_audio.delta"]
    assert len(deltas) == 40
    assert all(later > earlier for earlier, later in zip(deltas, deltas[1:], strict=False))
