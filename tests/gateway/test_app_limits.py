"""Connection limits over a live socket: session cap, session expiry, a client that stops reading."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from fakes import FakeBackend, tone
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.commands import SessionLimits
from live_server import serve
from omni_gateway.omni.protocol import AudioChunk, Done

TIMEOUT = 20


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/v1/realtime"


def test_sessions_beyond_the_cap_are_refused_with_503() -> None:
    async def go(port: int) -> int:
        async with connect(url(port)) as first:
            await first.recv()
            with pytest.raises(InvalidStatus) as info:
                async with connect(url(port)):
                    pass
            return info.value.response.status_code

    with serve(FakeBackend(), GatewayConfig(max_sessions=1)) as port:
        assert run(go(port)) == 503


def test_expired_session_gets_session_expired_then_close_1001() -> None:
    async def go(port: int) -> tuple[list[dict[str, Any]], int]:
        seen = []
        async with connect(url(port)) as ws:
            try:
                while True:
                    seen.append(json.loads(await ws.recv()))
            except ConnectionClosed as closed:
                assert closed.rcvd is not None
                return seen, closed.rcvd.code
        raise AssertionError("unreachable")

    with serve(FakeBackend(), GatewayConfig(session=SessionLimits(session_seconds=1))) as port:
        seen, code = run(go(port))
    assert code == 1001
    assert seen[-1]["type"] == "error" and seen[-1]["error"]["code"] == "session_expired"


def masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    mask = os.urandom(4)
    assert len(payload) < 126
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_a_client_that_stops_reading_is_disconnected_and_its_generation_aborted() -> None:
    # ~40 MB of audio deltas, far beyond what socket buffers hold, so the server's writer must block
    backend = FakeBackend(script=lambda request: [*(AudioChunk(tone(1000), 24000, "la ") for _ in range(300)),
                                                  Done("stop")])
    with serve(backend, GatewayConfig(send_queue_max=8, send_timeout_s=1.0)) as port:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing
        sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                     .encode())
        assert sock.recv(12) == b"HTTP/1.1 101"
        sock.sendall(masked_text_frame(json.dumps({"type": "response.create"})))
        deadline = time.monotonic() + TIMEOUT
        while not backend.aborted and time.monotonic() < deadline:
            time.sleep(0.05)
        sock.close()
    assert len(backend.aborted) == 1 and backend.aborted == backend.closed
