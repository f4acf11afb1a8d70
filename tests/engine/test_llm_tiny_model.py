"""The whole engine (scheduler, prefix cache, preemption, chunked prefill) over the real runner and a tiny
random Llama checkpoint, checked token for token against Hugging Face greedy generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine import LLM, SamplingParams

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.runner_driver import hf_greedy

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]
NEW_TOKENS = 12

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    """The checkpoint directory and Hugging Face's greedy continuation of each workload prompt."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    hf_model = save_tiny_checkpoint("llama", directory)
    return directory, [hf_greedy(hf_model, p, NEW_TOKENS) for p in workload()]


def workload() -> list[list[int]]:
    shared = [3 + (i * 11) % 300 for i in range(40)]  # a "system prompt" of 2.5 blocks
    with_prefix = [shared + [5 + i, 17 + i, 29 + i][: 1 + i % 3] for i in range(5)]
    distinct = [[7 + (i * 13 + j * 5) % 310 for j in range(6 + 9 * i)] for i in range(5)]
    return with_prefix + distinct


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "engine_args",
    [
        {},
        {"num_kv_blocks": 14, "max_num_batched_tokens": 24},  # preemption and chunked prefill
        {"enable_prefix_caching": False, "max_num_seqs": 3},
    ],
    ids=["roomy", "tight", "no-prefix-cache"],
)
def test_engine_matches_hf_greedy(
    checkpoint: tuple[Path, list[list[int]]], device: str, engine_args: dict[str, Any]
) -> None:
    directory, expected = checkpoint
    llm = LLM(model=str(directory), device=device, dtype="float32", max_model_len=128, **engine_args)
    prompts = workload()
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert [out.outputs[0].token_ids for out in outputs] == expected
    stats = llm.engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["running"] == 0 and stats["waiting"] == 0
    if engine_args.get("num_kv_blocks"):
        assert stats["num_preemptions"] > 0
    if engine_args.get("enable_prefix_caching", True):
        # Submitted together, the prompts after the first wait for its prefix blocks and then reuse them.
        assert stats["prefix_cache_hit_tokens"] >= 4 * 32
