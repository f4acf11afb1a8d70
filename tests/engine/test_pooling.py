"""Pooling requests over the real runner and a tiny random checkpoint, against the Hugging Face model's own
final hidden states pooled the same way; and the pooling a checkpoint declares."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine import SamplingParams
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.pooling import model_pooling
from omni_gateway.engine.errors import InvalidRequest

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.runner_driver import hf_greedy

PROMPTS = [[3 + (i * 7) % 200 for i in range(n)] for n in (1, 5, 23, 40)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    directory = tmp_path_factory.mktemp("tiny-qwen2")
    return directory, save_tiny_checkpoint("qwen2", directory)


def hf_pooled(hf_model: Any, ids: list[int], method: str) -> torch.Tensor:
    with torch.no_grad():
        hidden = hf_model.model(torch.tensor([ids])).last_hidden_state[0]
    vector = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[method]
    return torch.nn.functional.normalize(vector, dim=0)


def pooled(engine: LLMEngine, prompts: list[list[int]], method: str) -> tuple[list[Any], list[int]]:
    """Every prompt added at once, beside a greedy generation that shares their steps; stepped until all are
    done. The vector each prompt ended with, and the generated tokens."""
    engine.add_request("gen", GENERATED, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, SamplingParams(pooling=method))
    out: dict[str, Any] = {}
    tokens: list[int] = []
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.request_id == "gen":
                tokens += delta.token_ids
                continue
            assert delta.token_ids == () and delta.num_output_tokens == 0  # nothing sampled
            if delta.finished:
                out[delta.request_id] = delta.pooled
    return [out[f"r{i}"] for i in range(len(prompts))], tokens


CHUNKED = {"max_num_batched_tokens": 16}  # the longer prompts prefill over several steps
TIGHT = {"num_kv_blocks": 8, "max_num_batched_tokens": 24}  # too few KV blocks for every prompt at once
SLOW = pytest.mark.slow
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GENERATED = [11, 12, 13, 14, 15]
NEW_TOKENS = 6


@pytest.mark.parametrize(
    ("method", "engine_args"),
    [
        pytest.param("model", CHUNKED, id="model-chunked"),
        pytest.param("model", {}, id="model-whole", marks=SLOW),
        pytest.param("model", TIGHT, id="model-tight", marks=SLOW),
        pytest.param("mean", {}, id="mean-whole", marks=SLOW),
        pytest.param("mean", CHUNKED, id="mean-chunked", marks=SLOW),
        pytest.param("cls", TIGHT, id="cls-tight", marks=SLOW),
        pytest.param("last", {"pipeline_decode": "on"}, id="last-pipelined", marks=SLOW),
        pytest.param("model", {"device": "cuda"}, id="model-cuda", marks=GPU),  # CUDA graphs, pipelined decode
        pytest.param("mean", {"device": "cuda", **CHUNKED}, id="mean-cuda-chunked", marks=GPU),
    ],
)
def test_pooled_vectors_equal_the_hf_models(checkpoint: tuple[Path, Any], method: str, engine_args: dict) -> None:
    directory, hf_model = checkpoint
    config = EngineConfig(**{"model": str(directory), "device": "cpu", "dtype": "float32", **engine_args})
    engine = LLMEngine(config)
    assert engine.pooling == "last"  # a causal LM without a sentence-transformers config
    vectors, generated = pooled(engine, PROMPTS, method)
    for ids, vector in zip(PROMPTS, vectors):
        expected = hf_pooled(hf_model, ids, "last" if method == "model" else method)
        torch.testing.assert_close(vector.cpu(), expected, atol=2e-5, rtol=1e-4)
        assert abs(float(vector.norm()) - 1.0) < 1e-5
    assert generated == hf_greedy(hf_model, GENERATED, NEW_TOKENS)  # sampled rows beside unsampled ones
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0
    if engine_args.get("pipeline_decode") == "on":
        assert stats["decode_steps_ahead"] > 0  # the generation ran ahead once the pooling requests were done


def test_pooling_refuses_sampling_options() -> None:
    with pytest.raises(InvalidRequest, match="pooling request"):
        SamplingParams(pooling="last", n=2)
    with pytest.raises(InvalidRequest, match="pooling must be"):
        SamplingParams(pooling="max")


def test_a_sentence_transformers_directory_names_its_pooling(tmp_path: Path) -> None:
    assert model_pooling(tmp_path) == "last"
    (tmp_path / "modules.json").write_text(
        json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    )
    (tmp_path / "1_Pooling").mkdir()
    for key, method in (("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean")):
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({key: True}))
        assert model_pooling(tmp_path) == method
