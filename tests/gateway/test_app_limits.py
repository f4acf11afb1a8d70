"""Connection limits over a live socket: session cap, session expiry, a client that stops reading."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import os
import socket
import time
from typing import Any

import httpx
import pytest
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.commands import SessionLimits
from omni_gateway.omni.protocol import AudioChunk, Capabilities, Done, TextDelta
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.harness.fake_backend import FakeBackend, tone
from tests.harness.live_server import recv, serve, until

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


def test_voice_sessions_beyond_the_voice_capacity_are_refused_and_the_admitted_keep_working() -> None:
    async def go(port: int) -> tuple[int, dict[str, Any], str, str]:
        async with connect(url(port)) as first:
            assert json.loads(await first.recv())["type"] == "session.created"
            with pytest.raises(InvalidStatus) as info:
                async with connect(url(port)):
                    pass
            refusal = json.loads(info.value.response.body or b"{}")["error"]
            await first.send(json.dumps({"type": "input_audio_buffer.append", "audio": tone_b64(200)}))
            await first.send(json.dumps({"type": "input_audio_buffer.commit"}))
            committed = ""
            while committed != "input_audio_buffer.committed":  # the admitted session still answers
                committed = json.loads(await first.recv())["type"]
        while True:  # the closed session's place frees once the server has seen the close
            try:
                async with connect(url(port)) as later:
                    return info.value.response.status_code, refusal, committed, json.loads(await later.recv())["type"]
            except InvalidStatus:
                await asyncio.sleep(0.05)

    with serve(FakeBackend(), GatewayConfig(max_voice_sessions=1)) as port:
        status, refusal, committed, later = run(go(port))
    assert status == 503 and refusal["code"] == "voice_capacity_reached" and "try again later" in refusal["message"]
    assert committed == "input_audio_buffer.committed" and later == "session.created"


def test_the_voice_capacity_leaves_a_server_without_speech_stages_alone() -> None:
    async def go(port: int) -> list[str]:
        async with connect(url(port)) as first, connect(url(port)) as second:
            return [json.loads(await ws.recv())["type"] for ws in (first, second)]

    text_only = FakeBackend(
        vad=False,
        capabilities=Capabilities(
            model="text", input_modalities=frozenset({"text"}), output_modalities=frozenset({"text"})
        ),
    )
    with serve(text_only, GatewayConfig(max_voice_sessions=1)) as port:
        assert run(go(port)) == ["session.created", "session.created"]


def test_voice_sessions_are_refused_while_the_admitted_replies_fall_behind_real_time() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    def scraped(port: int) -> tuple[float, float]:
        """Sessions refused as falling behind, and the window's p90 RTF gauge."""
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        (refused,) = [
            s.value
            for s in samples
            if s.name == "omni_realtime_sessions_refused_total" and s.labels["reason"] == "voice_falling_behind"
        ]
        (p90,) = [s.value for s in samples if s.name == "omni_realtime_voice_rtf_p90"]
        return refused, p90

    async def go(port: int) -> tuple[tuple[float, float], int, dict[str, Any], tuple[float, float], str]:
        before = scraped(port)
        async with connect(url(port)) as first:
            await recv(first)
            for _ in range(8):  # replies streamed slower than they play: 40 ms of audio over ~120 ms
                await first.send(json.dumps({"type": "response.create", "response": {"instructions": "Talk."}}))
                await until(first, "response.done")
            with pytest.raises(InvalidStatus) as info:
                async with connect(url(port)):
                    pass
            after = scraped(port)
            await first.send(json.dumps({"type": "input_audio_buffer.append", "audio": tone_b64(200)}))
            await first.send(json.dumps({"type": "input_audio_buffer.commit"}))
            committed = (await until(first, "input_audio_buffer.committed"))[-1]["type"]  # it is still served
        refusal = json.loads(info.value.response.body or b"{}")["error"]
        return before, info.value.response.status_code, refusal, after, committed

    slow = FakeBackend(script=[*(AudioChunk(tone(10), 24000, "la ") for _ in range(4)), Done("stop")], chunk_delay=0.04)
    with serve(slow, GatewayConfig(voice_admission_rtf=0.9)) as port:
        before, status, refusal, after, committed = run(go(port))
    assert status == 503 and refusal["code"] == "voice_capacity_reached"
    assert "spoken replies are falling behind real time: p90 real-time factor" in refusal["message"]
    assert "over the last 8 replies (limit 0.9)" in refusal["message"]
    assert math.isnan(before[1]) and after[1] >= 0.9  # no reply in the window yet, then the slow ones
    assert after[0] == before[0] + 1 and committed == "input_audio_buffer.committed"


def test_voice_admission_by_replies_can_be_turned_off() -> None:
    async def go(port: int) -> str:
        async with connect(url(port)) as first:
            await recv(first)
            for _ in range(8):
                await first.send(json.dumps({"type": "response.create", "response": {"instructions": "Talk."}}))
                await until(first, "response.done")
            async with connect(url(port)) as second:
                return str((await recv(second))["type"])

    slow = FakeBackend(script=[*(AudioChunk(tone(10), 24000, "la ") for _ in range(4)), Done("stop")], chunk_delay=0.04)
    with serve(slow, GatewayConfig(voice_admission_rtf=0)) as port:
        assert run(go(port)) == "session.created"


def tone_b64(ms: int) -> str:
    return base64.b64encode(tone(ms)).decode()


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


def stalled_client(port: int) -> socket.socket:
    """A raw WebSocket client with a tiny receive buffer, past the handshake: it reads nothing unless told."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    handshake = b""
    while b"\r\n\r\n" not in handshake:
        handshake += sock.recv(1)
    assert handshake.startswith(b"HTTP/1.1 101")
    return sock


def test_a_client_that_stops_reading_is_disconnected_and_its_generation_aborted() -> None:
    # ~40 MB of audio deltas, far beyond what socket buffers hold, so the server's writer must block
    backend = FakeBackend(script=[*(AudioChunk(tone(1000), 24000, "la ") for _ in range(300)), Done("stop")])
    with serve(backend, GatewayConfig(send_queue_max=8, send_timeout_s=1.0)) as port:
        sock = stalled_client(port)
        sock.sendall(masked_text_frame(json.dumps({"type": "response.create", "response": {"instructions": "Talk."}})))
        deadline = time.monotonic() + TIMEOUT
        while not backend.aborted and time.monotonic() < deadline:
            time.sleep(0.05)
        sock.close()
    assert len(backend.aborted) == 1 and backend.aborted == backend.closed


def test_a_text_response_to_a_client_that_stops_reading_ends_once_the_outbox_bound_is_hit() -> None:
    # Text deltas (4 KB each, ~40 MB in all): as with audio, the writer blocks once the socket's buffers are
    # full, the outbox passes its bound and the generation is aborted, long before the send timeout.
    words = " ".join(f"word{i}" for i in range(600))[:4096]
    backend = FakeBackend(script=[*(TextDelta(words) for _ in range(10_000)), Done("stop")])
    config = GatewayConfig(send_queue_max=8, send_timeout_s=30.0)
    with serve(backend, config) as port:
        sock = stalled_client(port)
        response = {"instructions": "Talk.", "output_modalities": ["text"]}
        started = time.monotonic()
        sock.sendall(masked_text_frame(json.dumps({"type": "response.create", "response": response})))
        while not backend.aborted and time.monotonic() < started + TIMEOUT:
            time.sleep(0.05)
        stopped_after = time.monotonic() - started
        sock.close()
    assert len(backend.aborted) == 1 and backend.aborted == backend.closed
    assert stopped_after < config.send_timeout_s / 2  # the bound stopped it, not the wait of one event


def server_frames(data: bytes | bytearray, frames: list[tuple[int, bytes]], at: int = 0) -> int:
    """Appends (opcode, payload) of each unmasked server frame in ``data`` from ``at`` to ``frames``; returns
    where the first incomplete one starts."""
    while at + 2 <= len(data):
        opcode, length, start = data[at] & 0x0F, data[at + 1] & 0x7F, at + 2
        if length >= 126:
            width = 2 if length == 126 else 8
            length, start = int.from_bytes(data[start : start + width], "big"), start + width
        if start + length > len(data):
            break
        frames.append((opcode, data[start : start + length]))
        at = start + length
    return at


def test_a_reader_that_stalls_stops_its_generation_then_is_closed_with_1008(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="omni_gateway.gateway.realtime.connection")
    # An endless audio reply: only the slow-client bounds can stop it before the transport's keepalive (1011).
    backend = FakeBackend(
        script=[*(AudioChunk(tone(100), 24000, "la ") for _ in range(5000)), Done("stop")],
        chunk_delay=0.002,
    )
    config = GatewayConfig(send_queue_max=100_000, send_queue_max_bytes=256 * 1024, send_timeout_s=1.0)

    def dropped() -> bool:
        return any("(1008)" in record.getMessage() for record in caplog.records)

    with serve(backend, config) as port:
        sock = stalled_client(port)
        sock.sendall(masked_text_frame(json.dumps({"type": "response.create", "response": {"instructions": "Talk."}})))
        deadline = time.monotonic() + TIMEOUT
        while not dropped() and time.monotonic() < deadline:  # reading nothing meanwhile
            time.sleep(0.02)
        (request,) = backend.requests
        assert backend.aborted == [request.request_id]  # its generation was stopped before the drop
        sock.settimeout(TIMEOUT)
        frames: list[tuple[int, bytes]] = []
        data, at = bytearray(), 0
        while not frames or frames[-1][0] != 0x8:  # now read what was sent, up to the close frame
            chunk = sock.recv(1 << 20)
            assert chunk, "the server hung up without a close frame"
            data += chunk
            at = server_frames(data, frames, at)
        sock.close()
    assert backend.closed == [request.request_id]
    (close,) = [payload for opcode, payload in frames if opcode == 0x8]
    assert int.from_bytes(close[:2], "big") == 1008
    assert close[2:].decode() == "client is not reading its events: one waited 1 s unsent"
    deltas = sum(
        json.loads(payload)["type"] == "response.output_audio.delta" for opcode, payload in frames if opcode == 0x1
    )
    assert 0 < deltas < 5000
