"""Faults over the real engine (tiny random Llama, CPU) behind a live server: clients killed mid-stream leak
no KV blocks; an engine-thread failure turns /health, HTTP and open realtime sessions into explicit errors."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from omni_gateway.gateway.config import GatewayConfig
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.harness.live_server import serve
from tests.harness.real_engine import tiny_pipeline

pytestmark = pytest.mark.slow
TIMEOUT = 60


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pipe = tiny_pipeline(tmp_path_factory.mktemp("tiny-llama"))
    yield pipe
    pipe.shutdown()


def wait_for_stats(pipe: Any, done: Any, timeout: float = 15.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    stats = pipe.metrics()
    while not done(stats) and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = pipe.metrics()
    return stats


async def realtime_killed_after_first_delta(port: int) -> bool:
    """Ask for a long answer, then drop the TCP connection (no close frame) at the first text delta."""
    ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime")
    await ws.send(
        json.dumps(
            {
                "type": "response.create",
                "response": {
                    "output_modalities": ["text"],
                    "max_output_tokens": 200,
                    "input": [
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "tell me"}]}
                    ],
                },
            }
        )
    )
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "response.output_text.delta":
            ws.transport.abort()
            return True
        if event["type"] in ("response.done", "error"):  # finished before any delta: not a mid-stream kill
            await ws.close()
            return False


def sse_killed_after_first_chunk(port: int, reset: bool) -> bool:
    """A streamed chat completion whose socket is closed (FIN) or reset (RST) after the first data line."""
    body = json.dumps(
        {"model": "tiny-llama", "stream": True, "max_tokens": 200, "messages": [{"role": "user", "content": "tell me"}]}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while b"\ndata: {" not in seen and b"\r\n\r\ndata: {" not in seen:
        piece = sock.recv(4096)
        if not piece:
            break
        seen += piece
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    return b"data: {" in seen and b"[DONE]" not in seen


def test_clients_killed_mid_stream_leak_no_kv_blocks(pipeline: Any) -> None:
    with serve(pipeline, GatewayConfig()) as port:

        async def realtime_kills() -> list[bool]:
            return list(await asyncio.gather(*(realtime_killed_after_first_delta(port) for _ in range(6))))

        killed = run(realtime_kills())
        killed += [sse_killed_after_first_chunk(port, reset=i % 2 == 1) for i in range(4)]
        stats = wait_for_stats(pipeline, lambda s: s["kv_blocks_used"] == 0 and s["requests"] == 0)
        assert pipeline.health().ok
        # The server still answers after the carnage.
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=TIMEOUT,
            json={"model": "tiny-llama", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200
    after = wait_for_stats(pipeline, lambda s: s["kv_blocks_used"] == 0)
    print(
        f"\nclients killed mid-stream: {sum(killed)} of {len(killed)} (6 realtime, 4 SSE), KV blocks leaked: "
        f"{int(stats['kv_blocks_used'])} of {int(stats['kv_blocks_total'])}, requests left: {int(stats['requests'])}"
    )
    assert sum(killed) == len(killed)
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0 and stats["running"] == 0
    assert after["kv_blocks_used"] == 0


def test_an_engine_thread_failure_is_reported_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway.engine.runner.model_runner import ModelRunner

    pipe = tiny_pipeline(tmp_path)
    real_execute = ModelRunner.execute
    armed = {"on": False}

    def execute(self: ModelRunner, batch: Any, after: Any = None) -> Any:
        if armed["on"]:
            raise RuntimeError("injected runner fault")
        return real_execute(self, batch, after)

    monkeypatch.setattr(ModelRunner, "execute", execute)

    async def scenario(port: int) -> dict[str, Any]:
        idle = await connect(f"ws://127.0.0.1:{port}/v1/realtime")
        busy = await connect(f"ws://127.0.0.1:{port}/v1/realtime")
        for ws in (idle, busy):
            await ws.recv()
            await ws.recv()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
            assert (await http.get("/health")).status_code == 200
            armed["on"] = True
            t0 = time.perf_counter()
            await busy.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "response": {
                            "output_modalities": ["text"],
                            "input": [
                                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
                            ],
                        },
                    }
                )
            )
            while (await http.get("/health")).status_code != 503:
                await asyncio.sleep(0.05)
            health_s = time.perf_counter() - t0
            chat = await http.post(
                "/v1/chat/completions", json={"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}
            )

        async def drain(ws: Any) -> tuple[list[dict[str, Any]], int | None, float]:
            events = []
            try:
                while True:
                    events.append(json.loads(await ws.recv()))
            except ConnectionClosed as closed:
                return events, closed.rcvd.code if closed.rcvd else None, time.perf_counter() - t0

        return {"health_s": health_s, "chat": chat, "idle": await drain(idle), "busy": await drain(busy)}

    with serve(pipe, GatewayConfig(health_poll_s=0.2)) as port:
        out = run(scenario(port))
    pipe.shutdown()
    idle_events, idle_code, idle_s = out["idle"]
    busy_events, busy_code, _ = out["busy"]
    print(
        f"\nengine fault: /health 503 after {out['health_s'] * 1000:.0f} ms; idle session error+close "
        f"{idle_code} after {idle_s * 1000:.0f} ms; HTTP chat {out['chat'].status_code}"
    )
    assert out["health_s"] < 5.0
    assert out["chat"].status_code == 503
    assert [e["type"] for e in idle_events] == ["error"] and idle_code == 1011 and idle_s < 5.0
    assert idle_events[0]["error"]["code"] == "server_unavailable"
    done = [e for e in busy_events if e["type"] == "response.done"]
    assert len(done) == 1 and done[0]["response"]["status"] == "failed"
    assert busy_events[-1]["type"] == "error" and busy_code == 1011
    assert "injected" not in json.dumps(busy_events + idle_events)  # no exception text reaches clients
