"""A WebRTC call over the real engine (a tiny random Llama on the CPU): hung up mid-answer, it leaves the engine
with no request and no KV block in use."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from omni_gateway.gateway.config import GatewayConfig

from tests.harness.live_server import serve
from tests.harness.real_engine import tiny_pipeline
from tests.harness.webrtc_client import Caller, host_candidates_available

pytestmark = pytest.mark.skipif(
    not host_candidates_available(), reason="no network address besides loopback: ICE has no host candidate"
)

ASK = {
    "type": "response.create",
    "response": {
        "output_modalities": ["text"],
        "max_output_tokens": 200,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "tell me"}]}],
    },
}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pipe = tiny_pipeline(tmp_path_factory.mktemp("tiny-llama"))
    yield pipe
    pipe.shutdown()


def settled(pipe: Any, timeout: float = 15.0) -> dict[str, float]:
    """The engine's stats once it holds no request and no KV block, or as they are at ``timeout``."""
    deadline = time.monotonic() + timeout
    stats = pipe.metrics()
    while (stats["kv_blocks_used"] or stats["requests"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = pipe.metrics()
    return dict(stats)


def test_a_call_hung_up_mid_answer_leaves_no_kv_blocks_in_use(pipeline: Any) -> None:
    async def call(port: int) -> tuple[Caller, dict[str, float]]:
        caller = Caller()
        assert (await caller.place(f"http://127.0.0.1:{port}")).status_code == 201
        await caller.until("session.created")
        asks = 1
        caller.send(ASK)
        during = dict(pipeline.metrics())
        while not during["requests"]:  # hang up while the engine is answering
            if sum(event["type"] == "response.done" for event in caller.log) == asks:
                # the sampled answer ended (an early end of text) before a look caught it: ask again
                caller.send(ASK)
                asks += 1
            await asyncio.sleep(0.002)
            during = dict(pipeline.metrics())
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")).status_code == 200
        await caller.close()
        return caller, during

    with serve(pipeline, GatewayConfig()) as port:
        caller, during = asyncio.run(asyncio.wait_for(call(port), 60))
        after = settled(pipeline)
    assert "response.created" in [event["type"] for event in caller.log]
    assert during["kv_blocks_used"] > 0 and during["requests"] == 1  # hung up while the answer held KV blocks
    assert after["kv_blocks_used"] == 0 and after["requests"] == 0 and after["running"] == 0
