"""A test-side driver of the model runner, and HF's greedy continuation to compare it with.

The driver plays the scheduler: a bump allocator hands out KV blocks, each step batches every
unfinished sequence (prefill chunks next to decodes) and advances state from the results.
"""

from __future__ import annotations

from typing import Any

import torch
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.model_runner import ModelRunner
from omni_gateway.engine.sampling_params import SamplingParams


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF ``generate`` greedy continuation that never stops at EOS."""
    model.generation_config.eos_token_id = None
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


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
            results = self.runner.execute(ScheduledBatch([seqs[i] for i in live], counts, [])).results()
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
