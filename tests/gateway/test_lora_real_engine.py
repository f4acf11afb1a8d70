"""LoRA over the real engine (a tiny random Llama) through the HTTP API: an adapter loaded at run time serves
the completions that name it, as the engine gives them for that adapter, and leaves the base model's alone."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.protocol import Message, OmniRequest, TextPart

from tests.harness.live_server import served
from tests.harness.lora_adapters import ADAPTERS, save_adapter
from tests.harness.real_engine import tiny_pipeline

pytestmark = pytest.mark.slow
PROMPT = "the cat sat on the mat and then"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("lora-http")
    pipe = tiny_pipeline(root / "base", max_tokens=8, enable_lora=True, max_loras=2)
    from transformers import AutoModelForCausalLM

    save_adapter(AutoModelForCausalLM.from_pretrained(root / "base"), root / "all", seed=3, **ADAPTERS["all"])
    pipe.adapter_root = root
    yield pipe
    pipe.shutdown()


def _engine_text(pipeline: Any, lora: str | None) -> str:
    """What the engine itself generates for PROMPT with ``lora``, through no HTTP."""
    ids = pipeline.prompt_ids(OmniRequest("x", (Message("user", (TextPart(PROMPT),)),), raw_prompt=PROMPT))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, lora_name=lora)

    async def run() -> str:
        return "".join([d.text async for d in pipeline.engine.generate(ids, params)])

    return asyncio.run(run())


def test_loaded_adapter_serves_its_completions(pipeline: Any) -> None:
    folder = str(pipeline.adapter_root / "all")
    with served(pipeline) as (url, client):
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "all", "lora_path": folder})
        assert r.status_code == 200, r.text
        assert [m.id for m in client.models.list()] == ["tiny-llama", "all"]

        def complete(model: str) -> str:
            out = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0.0)
            return out.choices[0].text

        # The base model's reply first, then the adapter's over the same (cached) prompt blocks.
        base, adapted = complete("tiny-llama"), complete("all")
        assert adapted == _engine_text(pipeline, "all") and base == _engine_text(pipeline, None)
        assert adapted != base
        bad = httpx.post(
            f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(pipeline.adapter_root)}
        )
        assert bad.status_code == 400 and "adapter_config.json is missing" in bad.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "all"}).status_code == 200
        with pytest.raises(openai.NotFoundError):
            complete("all")
