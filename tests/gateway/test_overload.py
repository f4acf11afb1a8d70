"""Overload on a live realtime socket is answered at once: responses over the per-session cap and an engine
queue that is full both end in a failed ``response.done`` with a code, never in silence."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.commands import SessionLimits
from omni_gateway.omni.protocol import Done, Error
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import serve

TIMEOUT = 20


def out_of_band(i: int) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "output_modalities": ["text"],
                "metadata": {"i": str(i)},
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            },
        }
    )


def test_responses_over_the_session_cap_fail_at_once_and_the_rest_complete() -> None:
    backend = FakeBackend(reply="fine thanks")

    async def go(port: int) -> tuple[list[dict[str, Any]], float]:
        backend.gate = asyncio.Event()  # never set: the admitted responses stay running
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            await ws.recv()
            await ws.recv()
            t0 = time.perf_counter()
            for i in range(10):
                await ws.send(out_of_band(i))
            refused: list[dict[str, Any]] = []
            while len(refused) < 7:
                event = json.loads(await ws.recv())
                if event["type"] == "response.done":
                    refused.append(event)
            refused_s = time.perf_counter() - t0
            return refused, refused_s

    with serve(backend, GatewayConfig(session=SessionLimits(max_responses=3))) as port:
        refused, refused_s = asyncio.run(asyncio.wait_for(go(port), TIMEOUT))
    print(
        f"\n10 overlapping responses, cap 3: {len(refused)} refused within {refused_s * 1000:.0f} ms, "
        f"backend requests {len(backend.requests)}"
    )
    assert len(backend.requests) == 3
    assert all(
        e["response"]["status"] == "failed"
        and e["response"]["status_details"]["error"]["code"] == "rate_limit_exceeded"
        for e in refused
    )
    assert refused_s < 2.0


def test_a_full_engine_queue_fails_the_response_with_overloaded() -> None:
    backend = FakeBackend(
        script=[Error("overloaded", "waiting queue is full (4096 requests)", status=503), Done("error")]
    )

    async def go(port: int) -> dict[str, Any]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            await ws.recv()
            await ws.recv()
            await ws.send(out_of_band(0))
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "response.done":
                    return event

    with serve(backend, GatewayConfig()) as port:
        done = asyncio.run(asyncio.wait_for(go(port), TIMEOUT))
    assert done["response"]["status"] == "failed"
    assert done["response"]["status_details"]["error"]["code"] == "overloaded"
