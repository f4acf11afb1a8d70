"""The model runner on CUDA, with the Triton kernels and with the torch path, against HF on the CPU."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_checkpoints import RunnerDriver, greedy_seq, hf_greedy, save_tiny_checkpoint

from engine.config import EngineConfig
from engine.loader import load_model
from engine.model_runner import ModelRunner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    directory = tmp_path_factory.mktemp(request.param)
    return save_tiny_checkpoint(request.param, directory), directory


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_cuda_float32_matches_hf(checkpoint: tuple[Any, Path], backend: str) -> None:
    hf, directory = checkpoint
    config = EngineConfig(model=str(directory), device="cuda", dtype="float32", attention_backend=backend,
                          num_kv_blocks=64)
    runner = ModelRunner(config, load_model(config))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (7, 45, 20)]
    got = RunnerDriver(runner).generate([greedy_seq(p, str(i)) for i, p in enumerate(prompts)], 10, chunk=16)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf, prompt, 10)


def test_cuda_kv_cache_sized_from_memory_and_capped_by_need(checkpoint: tuple[Any, Path]) -> None:
    _, directory = checkpoint
    config = EngineConfig(model=str(directory), device="cuda", max_num_seqs=4)
    runner = ModelRunner(config, load_model(config))
    assert runner.dtype == torch.bfloat16
    # 4 sequences of the model's 256 positions need 4 * 16 blocks (+1 spare); memory allows far more.
    assert runner.num_kv_blocks == 4 * 16 + 1
    assert runner.kv_cache.device.type == "cuda"
