"""The model runner on the Triton kernels (the CPU interpreter here) against HF, prefill chunks
next to decodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.loader import load_model
from omni_gateway.engine.model_runner import ModelRunner

from benchmarks.checkpoints import save_tiny_checkpoint
from tests.engine.runner_driver import RunnerDriver, greedy_seq, hf_greedy


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_triton_runner_matches_hf(kind: str, device: torch.device, tmp_path: Path) -> None:
    hf = save_tiny_checkpoint(kind, tmp_path)
    config = EngineConfig(
        model=str(tmp_path),
        device=str(device),
        dtype="float32",
        attention_backend="triton",
        num_kv_blocks=32,
        enforce_eager=True,
    )
    runner = ModelRunner(config, load_model(config))
    assert runner.ops.name == "triton"
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (7, 30, 12)]
    # 16-token prefill chunks share the first steps with the short prompt's decodes.
    got = RunnerDriver(runner).generate([greedy_seq(p, str(i)) for i, p in enumerate(prompts)], 5, chunk=16)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf, prompt, 5)
