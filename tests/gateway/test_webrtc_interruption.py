"""Barge-in over WebRTC: the server drops the reply's queued audio and truncates the assistant item to what its
track sent, with no ``conversation.item.truncate`` from the caller; and calls leave nothing behind."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

import httpx
import pytest
from omni_gateway.gateway import metrics
from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.connection import RealtimeConnection
from omni_gateway.gateway.realtime.webrtc_socket import CallSocket

from tests.harness.fake_backend import FakeBackend, silence, tone
from tests.harness.live_server import serve
from tests.harness.webrtc_client import Caller, host_candidates_available

pytestmark = pytest.mark.skipif(
    not host_candidates_available(), reason="no network address besides loopback: ICE has no host candidate"
)

VAD = {"type": "server_vad", "silence_duration_ms": 300, "prefix_padding_ms": 0, "threshold": 0.3}
SPOKEN = {"type": "realtime", "audio": {"input": {"turn_detection": VAD}}}
REPLY_WORDS = 30  # 100 ms of audio a word: a 3 s reply


def test_speaking_over_the_reply_truncates_it_to_what_the_caller_heard() -> None:
    backend = FakeBackend(reply=" ".join(["word"] * REPLY_WORDS))

    async def call(port: int) -> tuple[Caller, dict[str, Any], int, int]:
        caller = Caller()
        assert (await caller.place(f"http://127.0.0.1:{port}", session=SPOKEN)).status_code == 201
        caller.microphone.say(tone(300, amplitude=30000) + silence(400))
        await caller.until("output_audio_buffer.started")
        await asyncio.sleep(0.6)
        caller.microphone.say(tone(300, amplitude=30000) + silence(400))
        seen = await caller.until("conversation.item.truncated")
        heard_then = len(caller.heard_at)
        await asyncio.sleep(0.5)
        assert "output_audio_buffer.cleared" in [event["type"] for event in seen]
        await caller.close()
        return caller, seen[-1], heard_then, len(caller.heard_at)

    with serve(backend) as port:
        caller, truncated, heard_then, heard_later = asyncio.run(asyncio.wait_for(call(port), 30))
    reply_item = next(e for e in caller.log if e["type"] == "response.output_item.added")["item"]["id"]
    assert truncated["item_id"] == reply_item
    end_ms = truncated["audio_end_ms"]
    assert 400 <= end_ms <= 2000  # cut well before its 3 s end
    # what the caller heard of the reply (20 ms loud frames) is what the item was cut to, give or take the
    # frames in flight and the jitter buffer
    assert abs(heard_then * 20 - end_ms) <= 300
    assert heard_later - heard_then <= 15  # the rest of the reply never played


def _calls_alive() -> set[int]:
    """The ids of the call sockets and connections alive now."""
    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, (CallSocket, RealtimeConnection))}


def _settled_objects(earlier: set[int], wait_s: float = 3.0) -> list[object]:
    """The live objects once the server's thread has finished tearing down the last call (its task may still be
    closing the peer connection when the hang-up answers); ``earlier``: calls alive before this test's."""
    deadline = time.monotonic() + wait_s
    while True:
        gc.collect()
        live = gc.get_objects()
        calls = [o for o in live if isinstance(o, (CallSocket, RealtimeConnection)) and id(o) not in earlier]
        if time.monotonic() > deadline or not calls:
            return live
        del live, calls
        time.sleep(0.05)


@pytest.mark.parametrize("count", [10, pytest.param(50, marks=pytest.mark.slow)])
def test_placed_and_hung_up_calls_leave_no_call_task_or_socket_behind(count: int) -> None:
    config = GatewayConfig()
    app = create_app(FakeBackend(), config)  # type: ignore[arg-type]

    async def calls(port: int, count: int) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(count):
                caller = Caller()
                assert (await caller.place(f"http://127.0.0.1:{port}")).status_code == 201
                await caller.until("session.created")
                assert (await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")).status_code == 200
                await caller.close()

    with serve(None, config, app) as port:
        asyncio.run(asyncio.wait_for(calls(port, 2), 30))  # aiortc's first call opens what it keeps for good
        before = len(os.listdir("/proc/self/fd"))
        earlier = _calls_alive()  # another test's calls are not this one's to count
        open_before = metrics.SESSIONS_OPEN._value.get()
        asyncio.run(asyncio.wait_for(calls(port, count), 6 * count))
        after = len(os.listdir("/proc/self/fd"))
        assert len(app.state.calls) == 0
        assert metrics.SESSIONS_OPEN._value.get() == open_before  # the guard counts no call still open
        live = _settled_objects(earlier)
        assert not [o for o in live if isinstance(o, (CallSocket, RealtimeConnection)) and id(o) not in earlier]
        pending = [o for o in live if isinstance(o, asyncio.Task) and not o.done()]
        uvicorn_own = ("Server.serve", "LifespanOn.main")  # the server's task and its lifespan's
        assert [t for t in pending if not any(name in repr(t.get_coro()) for name in uvicorn_own)] == []
    assert after - before <= 2  # each call held UDP sockets on both sides: all closed
