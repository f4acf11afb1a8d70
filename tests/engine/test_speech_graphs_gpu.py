"""Decode graphs for speech: the talker (M-RoPE, rows streamed in from the thinker) and a thinker that
returns hidden states replay graphs and give what their eager steps give."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.models.qwen2_5_omni_talker import load_talker
from omni_gateway.engine.sampling_params import SamplingParams

from tests.engine.test_talker import engine_codes, thinker_outputs
from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.tiny_omni import save_tiny_omni

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _config(eager: bool, model: str | None = None) -> EngineConfig:
    kw = {"model": model} if model else {}
    return EngineConfig(
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        enforce_eager=eager,
        **kw,
    )


def _count_replays(engine: LLMEngine, prefill: bool = False) -> list[int]:
    """Counts the steps that replay a graph: the decode graphs', or with ``prefill`` the prefill graphs'."""
    graphs = engine.runner.prefill_graphs if prefill else engine.runner.graphs
    assert graphs is not None
    replays = [0]
    forward = graphs.forward

    def counted(*args, **kwargs):
        out = forward(*args, **kwargs)
        replays[0] += out is not None
        return out

    graphs.forward = counted
    return replays


def test_talker_codes_from_graphs_match_eager(tmp_path: Path) -> None:
    directory = save_tiny_omni(tmp_path)
    eager = LLMEngine(_config(True), model=load_talker(directory))
    graphed = LLMEngine(_config(False), model=load_talker(directory))
    replays = _count_replays(graphed)
    prefills = _count_replays(graphed, prefill=True)
    for seed in range(2):
        rows = {k: v.cuda() for k, v in thinker_outputs(num_reply=6, seed=seed).items()}
        want = engine_codes(eager, rows, f"eager-{seed}", trickle=True)
        assert engine_codes(graphed, rows, f"graphed-{seed}", trickle=True) == want
    assert replays[0] > 10
    assert prefills[0] >= 2  # each prompt of rows streamed in from the thinker
    assert graphed.scheduler.kv.usage().num_used_blocks == 0


def test_thinker_hidden_states_from_graphs_match_eager(tmp_path: Path) -> None:
    save_tiny_checkpoint("qwen2", tmp_path, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, return_hidden_states=True)
    out = {}
    for eager in (True, False):
        engine = LLMEngine(_config(eager, str(tmp_path)))
        replays = None if eager else _count_replays(engine)
        prefills = None if eager else _count_replays(engine, prefill=True)
        engine.add_request("r", [5, 17, 42, 9, 11, 3], params)
        deltas = []
        while engine.has_unfinished():
            deltas += engine.step()
        hidden = torch.cat([d.hidden_states for d in deltas if d.hidden_states is not None])
        embeds = torch.cat([d.input_embeds for d in deltas if d.input_embeds is not None])
        assert hidden.device.type == "cuda"  # kept on the device for a talker in this process
        out[eager] = ([t for d in deltas for t in d.token_ids], hidden, embeds)
        if replays is not None and prefills is not None:
            assert replays[0] >= 6
            assert prefills[0] == 1  # the prompt's hidden states come from the prefill graph
    assert out[True][0] == out[False][0]
    torch.testing.assert_close(out[False][1], out[True][1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[False][2], out[True][2])
