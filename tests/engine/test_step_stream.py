"""``step_stream_priority``: checked at config time, and a no-op off CUDA (the GPU test of the stream itself
is ``test_speech_graphs_gpu.test_steps_on_a_priority_stream_match_the_default_stream``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.config import EngineConfig

from benchmarks.checkpoints import save_tiny_checkpoint


def test_a_positive_priority_is_refused() -> None:
    with pytest.raises(ValueError, match=r"step_stream_priority must be 0 or negative \(lower runs sooner\), got 2"):
        EngineConfig(step_stream_priority=2)
    assert EngineConfig(step_stream_priority=-3).step_stream_priority == -3


def test_on_the_cpu_steps_run_as_without_it(tmp_path: Path) -> None:
    save_tiny_checkpoint("llama", tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outputs = []
    for priority in (None, -2):
        llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", max_model_len=64, step_stream_priority=priority)
        assert llm.engine.runner.step_stream is None
        outputs.append(llm.generate([[3, 14, 15, 92, 65]], params)[0].outputs[0].token_ids)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 6
