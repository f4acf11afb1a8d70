"""LoRA adapters loaded and unloaded at run time through the asyncio fronts: the engine loop in a thread
(AsyncEngine) and an engine core in its own process (EngineCoreClient), whose restart keeps the adapters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.lora_adapters import NEW_TOKENS, PROMPTS, tiny_lora_set

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lora-fronts")
    return {"root": root, "expected": tiny_lora_set(root)}


def _config(root: Path) -> EngineConfig:
    return EngineConfig(
        model=str(root / "base"),
        device="cpu",
        dtype="float32",
        max_model_len=128,
        enable_lora=True,
        max_lora_rank=8,
        warmup="off",
    )


async def _tokens(engine: Any, prompt: list[int], lora: str | None) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, lora_name=lora)
    tokens: list[int] = []
    async for delta in engine.generate(prompt, params):
        tokens.extend(delta.token_ids)
    return tokens


async def _load_serve_unload(engine: Any, root: Path, expected: dict[Any, list[list[int]]]) -> None:
    await engine.load_lora("all", str(root / "all"))
    # While the adapter's request streams, another is loaded and then unloaded again.
    running = asyncio.ensure_future(_tokens(engine, PROMPTS[0], "all"))
    await engine.load_lora("attn", str(root / "attn"))
    assert engine.lora_adapters() == {"all": str(root / "all"), "attn": str(root / "attn")}
    assert await _tokens(engine, PROMPTS[1], "attn") == expected["attn"][1]
    await engine.unload_lora("attn")
    assert await running == expected["all"][0]
    with pytest.raises(InvalidRequest, match="does not exist"):
        await _tokens(engine, PROMPTS[1], "attn")
    with pytest.raises(InvalidRequest, match="rank 16, above --max-lora-rank 8"):
        await engine.load_lora("too-wide", str(root / "mlp"))
    with pytest.raises(InvalidRequest, match="is not a directory"):
        await engine.load_lora("ghost", str(root / "nowhere"))
    assert engine.lora_adapters() == {"all": str(root / "all")}


def test_async_engine_loads_and_unloads_between_steps(tiny: dict[str, Any]) -> None:
    from omni_gateway.engine.frontend.async_engine import AsyncEngine

    engine = AsyncEngine(_config(tiny["root"]))
    try:
        asyncio.run(_load_serve_unload(engine, tiny["root"], tiny["expected"]))
    finally:
        engine.shutdown()


def test_core_process_loads_unloads_and_restarts_with_its_adapters(tiny: dict[str, Any]) -> None:
    pytest.importorskip("zmq")
    from omni_gateway.engine.frontend.core_client import EngineCoreClient
    from omni_gateway.engine.frontend.core_process import ProcessLauncher

    root, expected = tiny["root"], tiny["expected"]
    engine = EngineCoreClient(_config(root), ProcessLauncher())
    try:
        asyncio.run(_load_serve_unload(engine, root, expected))
        engine.kill()  # as a crash would: the restarted core loads the adapters served when it died
        deadline = time.monotonic() + 10
        while engine.health()["alive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.health()["alive"] and engine.wait_alive(120.0)
        assert asyncio.run(_tokens(engine, PROMPTS[2], "all")) == expected["all"][2]
        assert engine.lora_adapters() == {"all": str(root / "all")}
    finally:
        engine.shutdown()
