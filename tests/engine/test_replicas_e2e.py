"""Two engine replicas of a tiny random Llama behind a live server, as local processes and as Ray actors:
realtime sessions spread over both and stay put; killing a replica mid-response fails that response with
an error event, the other replica's sessions and new sessions carry on, and the dead replica comes back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.frontend.launch import start_engine
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline
from websockets.asyncio.client import ClientConnection, connect

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.live_server import serve

pytest.importorskip("zmq")
pytestmark = pytest.mark.slow  # two engine processes load a model each
TIMEOUT = 120
MAX_MODEL_LEN = 256


def replicated_pipeline(directory: Path, backend: str) -> OmniPipeline:
    save_tiny_checkpoint("llama", directory)
    engine_config = EngineConfig(
        model=str(directory),
        device="cpu",
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        warmup="off",
        data_parallel_size=2,
        distributed_executor_backend=backend,
    )
    config = OmniConfig(engine=engine_config, asr=None, tts=None, vad=False, vision=False, temperature=1.0)
    engine = start_engine(engine_config, threads=1)
    return OmniPipeline(config, engine=engine, model_name="tiny-llama", max_context_tokens=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray", reason="the Ray backend needs the [ray] extra: pip install 'omni-gateway[ray]'")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


async def session(port: int) -> tuple[ClientConnection, str]:
    ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime")
    created = json.loads(await ws.recv())
    assert created["type"] == "session.created"
    return ws, created["session"]["id"]


async def respond(ws: ClientConnection, max_tokens: int = 6, on_delta: Any = None) -> list[dict[str, Any]]:
    """One response to a text message; the events up to its ``response.done``."""
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "tell me a story"}]}
    await ws.send(
        json.dumps(
            {
                "type": "response.create",
                "response": {"output_modalities": ["text"], "max_output_tokens": max_tokens, "input": [message]},
            }
        )
    )
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(await ws.recv())
        events.append(event)
        if event["type"] == "response.output_text.delta" and on_delta is not None:
            on_delta()
            on_delta = None
        if event["type"] == "response.done":
            return events


def status(events: list[dict[str, Any]]) -> str:
    return str(events[-1]["response"]["status"])


def served(events: list[dict[str, Any]]) -> bool:
    """Answered: done by its own end or by max_output_tokens ("incomplete"), never failed."""
    return status(events) in ("completed", "incomplete") and not any(e["type"] == "error" for e in events)


async def scenario(pipe: OmniPipeline, port: int) -> None:
    engine: Any = pipe.engine
    a, a_id = await session(port)
    b, b_id = await session(port)
    assert served(await respond(a)) and served(await respond(b))
    home_a, home_b = engine.router.session_replica(a_id), engine.router.session_replica(b_id)
    assert {home_a, home_b} == {0, 1}  # spread over both

    for _ in range(3):  # a tiny random model may end its answer before the kill lands: ask again
        events = await respond(a, max_tokens=250, on_delta=lambda: engine.kill(home_a))
        if status(events) == "failed":
            break
        assert engine.replicas[home_a].wait_alive(TIMEOUT)
    assert status(events) == "failed"
    assert any(e["type"] == "error" for e in events)
    assert not engine.replicas[home_a].alive or engine.replicas[home_a].pid  # dead, or already back

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
        assert (await http.get("/health")).status_code == 200  # the survivor serves
    assert served(await respond(b))  # the other replica's session never noticed
    c, c_id = await session(port)
    assert served(await respond(c))  # a new session is served
    assert engine.router.session_replica(c_id) is not None

    assert await asyncio.to_thread(engine.replicas[home_a].wait_alive, TIMEOUT)  # restarted
    assert served(await respond(a))  # the session goes on, on a live replica
    for ws in (a, b, c):
        await ws.close()


def run_scenario(pipe: OmniPipeline) -> None:
    try:
        with serve(pipe, GatewayConfig(health_poll_s=0.2)) as port:
            asyncio.run(asyncio.wait_for(scenario(pipe, port), TIMEOUT * 3))
    finally:
        pipe.shutdown()


def test_data_parallel_processes(tmp_path: Path) -> None:
    run_scenario(replicated_pipeline(tmp_path, "mp"))


def test_ray_actors(tmp_path: Path, ray_cluster: None) -> None:
    import ray

    pipe = replicated_pipeline(tmp_path, "ray")
    groups = [g for g in ray.util.placement_group_table().values() if g["name"].startswith("omni-engine-")]
    assert sorted((g["strategy"], g["state"]) for g in groups) == [("STRICT_PACK", "CREATED")] * 2
    run_scenario(pipe)
