"""The model runner on CUDA, with the Triton kernels and with the torch path, against HF on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.sequence import ScheduledBatch
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.runner_driver import RunnerDriver, greedy_seq, hf_greedy

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    directory = tmp_path_factory.mktemp(request.param)
    return save_tiny_checkpoint(request.param, directory), directory


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_cuda_float32_matches_hf(checkpoint: tuple[Any, Path], backend: str) -> None:
    hf, directory = checkpoint
    config = EngineConfig(
        model=str(directory), device="cuda", dtype="float32", attention_backend=backend, num_kv_blocks=64
    )
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


def test_decode_graphs_match_the_eager_forward(checkpoint: tuple[Any, Path]) -> None:
    _, directory = checkpoint
    config = EngineConfig(
        model=str(directory),
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        num_kv_blocks=64,
        max_num_seqs=8,
    )
    runner = ModelRunner(config, load_model(config))
    assert runner.graphs is not None and runner.graphs.buckets == [1, 2, 4, 8]
    gen = torch.Generator().manual_seed(5)
    seqs = [greedy_seq(torch.randint(2, 300, (n,), generator=gen).tolist(), str(i)) for i, n in enumerate((9, 33, 17))]
    driver = RunnerDriver(runner)
    driver.generate(seqs, 3)  # prefill, then decodes through the graphs (3 rows run the 4-row bucket)
    for seq in seqs:
        driver.allocate(seq, len(seq))
    forward = runner.graphs.forward(seqs)
    assert forward is not None
    logits, argmax = forward.logits.clone(), forward.argmax.clone()
    runner.prefill_graphs = None  # the eager forward, not the prefill graph of a 3-token step
    eager = runner.run_plan(runner._plan(ScheduledBatch(seqs, [1] * len(seqs), []))[0])
    assert eager is not None
    torch.testing.assert_close(logits, eager, rtol=1e-4, atol=1e-4)
    assert torch.equal(argmax, logits.argmax(dim=-1))


def test_batches_beyond_the_largest_graph_run_eagerly(checkpoint: tuple[Any, Path]) -> None:
    hf, directory = checkpoint
    config = EngineConfig(
        model=str(directory),
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        num_kv_blocks=64,
        max_num_seqs=2,
    )
    runner = ModelRunner(config, load_model(config))
    assert runner.graphs is not None and runner.graphs.buckets == [1, 2]
    prompts = [[3 + i, 40, 41 + i] for i in range(3)]  # 3 decodes: no graph holds them
    got = RunnerDriver(runner).generate([greedy_seq(p, str(i)) for i, p in enumerate(prompts)], 4)
    assert got == [hf_greedy(hf, p, 4) for p in prompts]
