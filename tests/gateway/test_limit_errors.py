"""Each configured limit, crossed over a live socket, answers with an explicit error that names it."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.realtime.commands import SessionLimits
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import serve

KIB = 1024
CONFIG = GatewayConfig(
    max_frame_bytes=256 * KIB,
    session=SessionLimits(max_append_bytes=32 * KIB, max_buffer_bytes=96 * KIB),
    http=HttpLimits(max_n=2, max_body_bytes=128 * KIB),
)


def append(n_bytes: int) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(n_bytes)).decode()})


async def realtime_matrix(port: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None) as ws:
        await ws.recv()
        await ws.recv()
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                }
            )
        )
        assert json.loads(await ws.recv())["type"] == "session.updated"
        await ws.send(append(32 * KIB + 2))
        seen["append over 32 KiB"] = json.loads(await ws.recv())["error"]
        for _ in range(3):
            await ws.send(append(32 * KIB))  # 96 KiB buffered: at the cap, accepted silently
        await ws.send(append(2))
        seen["buffer over 96 KiB"] = json.loads(await ws.recv())["error"]
        await ws.send("x" * (256 * KIB + 1))
        try:
            await ws.recv()
        except ConnectionClosed as closed:
            seen["frame over 256 KiB"] = closed.rcvd.code if closed.rcvd else None
    return seen


def test_limits_answer_with_errors_that_name_them() -> None:
    with serve(FakeBackend(), CONFIG) as port:
        seen = asyncio.run(asyncio.wait_for(realtime_matrix(port), 20))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:
            chat = {"model": "omni-test", "messages": [{"role": "user", "content": "hi"}]}
            seen["n over 2"] = http.post("/v1/chat/completions", json={**chat, "n": 3}).json()["error"]
            seen["body over 128 KiB"] = http.post("/v1/chat/completions", content=b"{" + b" " * 128 * KIB).json()[
                "error"
            ]
    for case, outcome in seen.items():
        print(f"{case}: {outcome if isinstance(outcome, int) else (outcome.get('code'), outcome.get('param'))}")
    assert seen["append over 32 KiB"]["param"] == "audio" and str(32 * KIB) in seen["append over 32 KiB"]["message"]
    assert seen["buffer over 96 KiB"]["param"] == "audio" and str(96 * KIB) in seen["buffer over 96 KiB"]["message"]
    assert seen["frame over 256 KiB"] == 1009
    assert seen["n over 2"]["param"] == "n"
    assert seen["body over 128 KiB"]["code"] == "request_too_large"
