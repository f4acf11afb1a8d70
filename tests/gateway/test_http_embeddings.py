"""/v1/embeddings through the openai SDK: over the fake backend (shapes, encodings, errors) and over the real
engine on a tiny checkpoint, whose vectors must equal the Hugging Face model's pooled hidden states."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from omni_gateway.omni.protocol import Error

from tests.harness.live_server import served

MODEL = "omni-test"


def test_inputs_of_every_shape(fake):
    backend, _, client = fake
    r = client.embeddings.create(model=MODEL, input=["hello world", "hi"], encoding_format="float")
    assert [d.index for d in r.data] == [0, 1] and len(r.data[0].embedding) == 8
    assert r.usage.prompt_tokens == 3 and r.usage.total_tokens == 3 and r.model == MODEL
    assert abs(sum(x * x for x in r.data[0].embedding) - 1.0) < 1e-9
    assert client.embeddings.create(model=MODEL, input="hello world", encoding_format="float").data[0].embedding == (
        r.data[0].embedding
    )
    client.embeddings.create(model=MODEL, input=[5, 6, 7], encoding_format="float")
    client.embeddings.create(model=MODEL, input=[[5, 6], [7]], encoding_format="float")
    assert [e.inputs for e in backend.embedded[-2:]] == [((5, 6, 7),), ((5, 6), (7,))]


def test_base64_is_little_endian_float32(fake):
    _, url, client = fake
    plain = client.embeddings.create(model=MODEL, input="hello", encoding_format="float").data[0].embedding
    raw = httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": "hello", "encoding_format": "base64"})
    packed = base64.b64decode(raw.json()["data"][0]["embedding"])
    assert struct.unpack(f"<{len(packed) // 4}f", packed) == pytest.approx(plain, abs=1e-7)
    # the SDK asks for base64 by default and decodes it itself
    assert client.embeddings.create(model=MODEL, input="hello").data[0].embedding == pytest.approx(plain, abs=1e-7)


def test_dimensions_must_be_the_models_own(fake):
    _, _, client = fake
    assert len(client.embeddings.create(model=MODEL, input="x", dimensions=8).data[0].embedding) == 8
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=MODEL, input="x", dimensions=4)
    assert caught.value.body["param"] == "dimensions" and "8" in caught.value.body["message"]


@pytest.mark.parametrize(
    ("value", "param"),
    [("", "input[0]"), ([], "input"), ([[1], "x", []], "input[2]"), ([-1], "input[0]"), (3, "input")],
)
def test_bad_inputs_are_named(fake, value: Any, param: str):
    _, url, _ = fake
    r = httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_a_backend_refusal_keeps_its_status(fake):
    backend, _, client = fake
    backend.script = [Error("overloaded", "the engine queue is full; retry later", status=503)]
    with pytest.raises(openai.InternalServerError) as caught:
        client.embeddings.create(model=MODEL, input="x")
    assert caught.value.status_code == 503


@pytest.mark.slow
def test_the_real_engine_pools_as_the_hf_model(tmp_path: Path) -> None:
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.omni.config import EngineConfig, OmniConfig
    from omni_gateway.omni.pipeline import OmniPipeline
    from transformers import AutoTokenizer

    from tests.harness.checkpoints import save_tiny_checkpoint

    hf_model = save_tiny_checkpoint("qwen2", tmp_path)
    engine_config = EngineConfig(model=str(tmp_path), device="cpu", dtype="float32", max_model_len=256)
    config = OmniConfig(engine=engine_config, asr=None, tts=None, vad=False, vision=False)
    engine = AsyncEngine(engine_config)
    pipeline = OmniPipeline(config, engine=engine, model_name="tiny", max_context_tokens=256)
    texts = ["the cat sat on the mat", "hello", "a somewhat longer sentence about embeddings and pooling"]
    try:
        with served(pipeline) as (_, client):
            r = client.embeddings.create(model="tiny", input=[*texts, [5, 9, 11]])
            with pytest.raises(openai.BadRequestError) as caught:
                client.embeddings.create(model="tiny", input=[[1] * 300])
    finally:
        engine.shutdown()
    assert caught.value.body["param"] == "input"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    prompts = [tokenizer.encode(t) for t in texts] + [[5, 9, 11]]
    for ids, data in zip(prompts, r.data):
        with torch.no_grad():
            hidden = hf_model.model(torch.tensor([ids])).last_hidden_state[0]
        expected = torch.nn.functional.normalize(hidden[-1], dim=0)  # a causal LM pools its last token
        torch.testing.assert_close(torch.tensor(data.embedding), expected, atol=2e-5, rtol=1e-4)
    assert r.usage.prompt_tokens == sum(len(p) for p in prompts)
