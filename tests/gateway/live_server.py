"""A real uvicorn server on a free loopback port, in a thread, for socket-level tests, and the
client-side reads those tests share."""

from __future__ import annotations

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
from websockets.asyncio.client import ClientConnection


@contextlib.contextmanager
def serve(backend: object, config: GatewayConfig | None = None) -> Iterator[int]:
    """Yields the port; the server stops when the block ends."""
    config = config or GatewayConfig()
    app = create_app(backend, config)  # type: ignore[arg-type]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", ws_max_size=config.max_frame_bytes, lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await ws.recv())


async def until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    """Every event up to and including the first of type ``kind``."""
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["type"] != kind:
        seen.append(await recv(ws))
    return seen
