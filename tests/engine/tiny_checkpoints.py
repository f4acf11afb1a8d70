"""Tiny random HF checkpoints (saved with save_pretrained) and a test-side driver of the model runner.

The driver plays the scheduler: a bump allocator hands out KV blocks, each step batches every
unfinished sequence (prefill chunks next to decodes) and advances state from the results.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from engine_fakes import byte_level_tokenizer

from omni_gateway.engine.model_runner import ModelRunner
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.engine.sequence import ScheduledBatch, Sequence

VOCAB = 384  # >= the byte-level test tokenizer's 330 tokens


def tiny_config(kind: str) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    # A wide init keeps logits well apart, so greedy ties cannot flip on float rounding.
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.3, eos_token_id=0, bos_token_id=1)
    if kind == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    if kind == "llama3-rope":
        return LlamaConfig(**common, tie_word_embeddings=True, rope_theta=50000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if kind == "mistral":
        return MistralConfig(**common, sliding_window=64, tie_word_embeddings=False)
    if kind == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=True)
    if kind == "qwen3":
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
    raise ValueError(kind)


def save_tiny_checkpoint(kind: str, directory: Path, seed: int = 0) -> Any:
    """Save a random model of ``kind`` plus a tokenizer into ``directory``; returns the HF model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind), dtype=torch.float32).eval()
    model.save_pretrained(directory)
    byte_level_tokenizer().save_pretrained(directory)
    return model


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF ``generate`` greedy continuation that never stops at EOS."""
    model.generation_config.eos_token_id = None
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


class RunnerDriver:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.next_block = 1  # block 0 stays unused so padded table entries never alias live data

    def allocate(self, seq: Sequence, upto: int) -> None:
        while len(seq.block_table) * self.runner.block_size < upto:
            assert self.next_block < self.runner.num_kv_blocks, "test allocator ran out of KV blocks"
            seq.block_table.append(self.next_block)
            self.next_block += 1

    def generate(self, seqs: list[Sequence], max_new_tokens: int, chunk: int = 1 << 30) -> list[list[int]]:
        """Run ``seqs`` together until each has ``max_new_tokens`` outputs (EOS ignored); prefill
        proceeds ``chunk`` tokens per step, so long prompts share steps with other sequences' decodes."""
        outputs: list[list[int]] = [[] for _ in seqs]
        while any(len(o) < max_new_tokens for o in outputs):
            live = [i for i, o in enumerate(outputs) if len(o) < max_new_tokens]
            counts = [min(chunk, len(seqs[i]) - seqs[i].num_computed_tokens) for i in live]
            for i, n in zip(live, counts):
                self.allocate(seqs[i], seqs[i].num_computed_tokens + n)
            results = self.runner.execute(ScheduledBatch([seqs[i] for i in live], counts, []))
            for i, n, result in zip(live, counts, results):
                seq = seqs[i]
                seq.num_computed_tokens += n
                if seq.num_computed_tokens == len(seq):
                    assert result is not None, "runner did not sample at the end of the context"
                    seq.token_ids.append(result.token_id)
                    outputs[i].append(result.token_id)
                else:
                    assert result is None, "runner sampled in the middle of a prefill"
        return outputs


def greedy_seq(prompt: list[int], request_id: str = "r") -> Sequence:
    return Sequence(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))
