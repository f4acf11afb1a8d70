"""Greedy output of our paged model runner is token-identical to HF transformers ``generate``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.models.linear import Linear, onednn_prepacks
from omni_gateway.engine.runner.loader import default_model_path, load_model
from omni_gateway.engine.runner.model_runner import ModelRunner
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.runner_driver import RunnerDriver, greedy_seq, hf_greedy

NEW_TOKENS = 12


def _prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module", params=["llama", "llama3-rope", "qwen2", "qwen3"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ModelRunner]:
    directory = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_checkpoint(request.param, directory)
    loaded = load_model(EngineConfig(model=str(directory)))
    runner = ModelRunner(EngineConfig(model=str(directory), device="cpu", num_kv_blocks=128), loaded)
    return hf, runner


def test_linear_matches_torch_for_one_row_and_many() -> None:
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    linear = Linear.build(
        weight,
        bias,
        torch.nn.functional.linear,
        prepack=onednn_prepacks(torch.device("cpu"), torch.float32),
        packed_rows=2,
    )
    for rows in (1, 2, 17):  # one row takes the plain weight, more the oneDNN copy where there is one
        x = torch.randn(rows, 24, generator=gen)
        torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_batched_chunked_prefill_matches_hf(tiny: tuple[Any, ModelRunner]) -> None:
    hf, runner = tiny
    prompts = _prompts(300, [5, 40, 23], seed=1)
    seqs = [greedy_seq(p, f"r{i}") for i, p in enumerate(prompts)]
    # chunk 16: the 40-token prompt prefills over three steps while the 5-token one already decodes.
    got = RunnerDriver(runner).generate(seqs, NEW_TOKENS, chunk=16)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf, prompt, NEW_TOKENS)


def test_cached_prefix_is_reused_not_recomputed(tiny: tuple[Any, ModelRunner]) -> None:
    hf, runner = tiny
    shared, tail_a, tail_b = _prompts(300, [32, 7, 11], seed=2)
    driver = RunnerDriver(runner)
    first = greedy_seq(shared + tail_a, "a")
    driver.generate([first], 2)
    second = greedy_seq(shared + tail_b, "b")
    # Hand over the full blocks of the shared prefix, as the prefix cache would.
    second.block_table = first.block_table[: 32 // runner.block_size]
    second.num_computed_tokens = 32
    got = driver.generate([second], NEW_TOKENS)[0]
    assert got == hf_greedy(hf, shared + tail_b, NEW_TOKENS)


def test_embed_span_replaces_token_embeddings(tiny: tuple[Any, ModelRunner]) -> None:
    from omni_gateway.engine.core.sequence import EmbedSpan

    hf, runner = tiny
    prompt = _prompts(300, [20], seed=3)[0]
    model = runner.model
    other = _prompts(300, [4], seed=4)[0]
    embeds = model.embed[torch.tensor(other)].clone()
    span = EmbedSpan(offset=6, length=4, key="img", embeds=embeds)
    seq = greedy_seq(prompt)
    seq.embed_spans = (span,)
    # Chunk 8 splits the span across two steps.
    got = RunnerDriver(runner).generate([seq], 6, chunk=8)[0]
    assert got == hf_greedy(hf, prompt[:6] + other + prompt[10:], 6)


@pytest.mark.slow
def test_smollm2_gguf_matches_hf() -> None:
    from transformers import AutoModelForCausalLM

    loaded = load_model(EngineConfig())
    runner = ModelRunner(EngineConfig(device="cpu", num_kv_blocks=64), loaded)
    tok = loaded.tokenizer
    questions = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    got = RunnerDriver(runner).generate([greedy_seq(p, str(i)) for i, p in enumerate(prompts)], 20, chunk=16)

    path = Path(default_model_path())
    hf = AutoModelForCausalLM.from_pretrained(os.fspath(path.parent), gguf_file=path.name, dtype=torch.float32)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf.eval(), prompt, 20)


def test_llm_generate_matches_hf(tmp_path: Path) -> None:
    from omni_gateway.engine.frontend.llm import LLM

    hf = save_tiny_checkpoint("qwen2", tmp_path, seed=5)
    prompts = _prompts(300, [9, 30, 17, 3], seed=6)
    llm = LLM(str(tmp_path), device="cpu", num_kv_blocks=64, max_num_batched_tokens=32)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS)
