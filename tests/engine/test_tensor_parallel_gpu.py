"""Tensor parallel on CUDA over NCCL, with the decode graphs (their capture holds the all-reduces)
and pipelined decode: TP=2 and TP=4 generate what TP=1 generates, in float32."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.sampling_params import SamplingParams

from tests.engine.test_tensor_parallel import assert_same, generate
from tests.harness.checkpoints import save_tiny_checkpoint

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason="needs at least 2 CUDA GPUs")]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp(request.param)
    save_tiny_checkpoint(request.param, directory)
    return directory


@pytest.mark.timeout(600)
@pytest.mark.parametrize("tp", [2, 4])  # 4 ranks replicate the tiny models' 2 KV heads
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_ranks_on_gpus_generate_what_one_gpu_generates(checkpoint: Path, tp: int, eager: bool) -> None:
    if tp > GPUS:
        pytest.skip(f"needs {tp} CUDA GPUs, found {GPUS}")
    single = generate(str(checkpoint), 1, device="cuda", enforce_eager=eager, max_num_seqs=8)
    assert_same(single, generate(str(checkpoint), tp, device="cuda", enforce_eager=eager, max_num_seqs=8))


@pytest.mark.timeout(600)
def test_decode_graphs_are_captured_on_every_rank_and_replayed(checkpoint: Path) -> None:
    config = EngineConfig(model=str(checkpoint), device="cuda", dtype="float32", tensor_parallel_size=2, max_num_seqs=4)
    engine = LLMEngine(config)
    try:
        runner = engine.runner
        assert getattr(runner, "graphs", None) is not None, "TP=2 on CUDA runs its decodes from graphs"
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        for i in range(3):
            engine.add_request(str(i), [5 + i, 9, 33, 7], params)
        while engine.has_unfinished():
            engine.step()
        outputs = engine.pop_finished()
        assert all(len(out.outputs[0].token_ids) == 16 for out in outputs)
        assert engine.num_steps_ahead > 0, "pipelined decode ran with tensor parallel"
    finally:
        engine.shutdown()
    assert multiprocessing.active_children() == []


def test_more_ranks_than_gpus_are_refused(checkpoint: Path) -> None:
    config = EngineConfig(model=str(checkpoint), device="cuda", tensor_parallel_size=GPUS * 2)
    with pytest.raises(ValueError, match=f"needs {GPUS * 2} CUDA devices, found {GPUS}"):
        LLMEngine(config)
    assert multiprocessing.active_children() == []
