"""Mixture-of-experts models on CUDA: the fused Triton MoE inside the runner's CUDA graphs (decode and prefill)
against transformers on the CPU in float32, and in bfloat16 the graphs against the eager forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner

from tests.harness.checkpoints import MOE_KINDS, save_tiny_checkpoint
from tests.harness.runner_driver import RunnerDriver, greedy_seq, hf_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=MOE_KINDS)
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    directory = tmp_path_factory.mktemp(request.param)
    return save_tiny_checkpoint(request.param, directory), directory


def _generate(directory: Path, dtype: str, **config: Any) -> tuple[list[list[int]], list[list[int]], ModelRunner]:
    engine_config = EngineConfig(model=str(directory), device="cuda", dtype=dtype, num_kv_blocks=64, **config)
    runner = ModelRunner(engine_config, load_model(engine_config))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (7, 45, 20)]
    got = RunnerDriver(runner).generate([greedy_seq(p, str(i)) for i, p in enumerate(prompts)], 10, chunk=16)
    return prompts, got, runner


def test_cuda_graphs_float32_match_hf(checkpoint: tuple[Any, Path]) -> None:
    hf, directory = checkpoint
    prompts, got, runner = _generate(directory, "float32")
    assert runner.ops.name == "triton" and runner.graphs is not None, "the fused MoE runs inside CUDA graphs"
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf, prompt, 10)


def test_cuda_graphs_bfloat16_match_the_eager_forward(checkpoint: tuple[Any, Path]) -> None:
    _, directory = checkpoint
    _, graphed, runner = _generate(directory, "bfloat16")
    assert runner.graphs is not None
    _, eager, _ = _generate(directory, "bfloat16", enforce_eager=True)
    assert graphed == eager
