"""The gateway's real application on a free loopback port, served by uvicorn in a thread: what the socket-level
tests and the end-to-end benchmarks talk to, plus the client-side reads they share."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.config import GatewayConfig
from websockets.asyncio.client import ClientConnection, connect

START_TIMEOUT_S = 10


@contextlib.contextmanager
def serve(backend: object, config: GatewayConfig | None = None, app: Any = None) -> Iterator[int]:
    """Serve ``backend`` (any ``OmniBackend``) behind ``config`` (or ``app``, built by ``create_app`` for a test
    that reads its state); yields the port, and stops the server (waiting for its thread) when the block ends.
    The socket is bound before the server starts, so the port cannot be taken in between."""
    config = config or GatewayConfig()
    app = app if app is not None else create_app(backend, config)  # type: ignore[arg-type]
    # IPPROTO_TCP named, as uvicorn.run's own socket has it: asyncio sets TCP_NODELAY only on sockets whose
    # protocol says TCP, and without it an event sent right after another waits ~40 ms for the client's ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            ws_max_size=config.max_frame_bytes,
            ws_per_message_deflate=config.ws_compression,
            lifespan="on",  # the app ends its live WebRTC calls at shutdown
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start within {START_TIMEOUT_S} s")
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def served(backend: object, config: GatewayConfig | None = None) -> Iterator[tuple[str, Any]]:
    """``serve``, as ``(base URL, openai.OpenAI client)`` for the HTTP API."""
    import openai

    config = config or GatewayConfig()
    with serve(backend, config) as port:
        url = f"http://127.0.0.1:{port}"
        yield url, openai.OpenAI(base_url=f"{url}/v1", api_key=config.api_key or "unused", max_retries=0, timeout=20)


async def recv(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(await ws.recv())
    return event


async def until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    """Every event up to and including the first of type ``kind``."""
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["type"] != kind:
        seen.append(await recv(ws))
    return seen


async def audio_turn(
    port: int, session: dict[str, Any], pcm16: bytes, *, also: str | None = None
) -> list[dict[str, Any]]:
    """One realtime session on ``port``: ``session.update`` with ``session``, then the audio appended and
    committed and a response asked for; every event up to ``response.done``, and on to the first event of
    type ``also`` when one did not come before it."""
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=m") as ws:
        await recv(ws)  # session.created
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await until(ws, "session.updated")
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create"}))
        seen = await until(ws, "response.done")
        if also is not None and not any(e["type"] == also for e in seen):
            seen += await until(ws, also)
        return seen
