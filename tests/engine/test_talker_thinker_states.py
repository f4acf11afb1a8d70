"""What a talker is conditioned on: the thinker's per-position hidden states and input embeddings,
returned by the engine with ``SamplingParams(return_hidden_states=True)``, against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.llm_engine import LLMEngine
from omni_gateway.engine.sampling_params import SamplingParams

from benchmarks.checkpoints import save_tiny_checkpoint

NEW = 6


@pytest.mark.slow
def test_hidden_states_match_hf_generate(tmp_path: Path) -> None:
    hf = save_tiny_checkpoint("qwen2", tmp_path, seed=3)
    engine = LLMEngine(
        EngineConfig(model=str(tmp_path), device="cpu", attention_backend="torch", max_num_batched_tokens=8)
    )
    prompt = [5, 17, 42, 9, 11, 3, 77, 21, 8, 30, 2]
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, return_hidden_states=True)
    # A first request leaves the prompt's blocks in the prefix cache; the second must recompute them anyway.
    for rid in ("first", "second"):
        engine.add_request(rid, prompt, params)
        deltas = []
        while engine.has_unfinished():
            deltas += engine.step()
        starts = [d.hidden_start for d in deltas if d.hidden_states is not None]
        hidden = torch.cat([d.hidden_states for d in deltas if d.hidden_states is not None])
        embeds = torch.cat([d.input_embeds for d in deltas if d.input_embeds is not None])
        tokens = [t for d in deltas for t in d.token_ids]
        assert starts[0] == 0 and deltas[-1].num_cached_tokens == 0

        with torch.no_grad():
            out = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=NEW,
                do_sample=False,
                output_hidden_states=True,
                return_dict_in_generate=True,
                min_new_tokens=NEW,
            )
        assert tokens == out.sequences[0, len(prompt) :].tolist()
        want_hidden = torch.cat([step[-1][0] for step in out.hidden_states])  # prompt, then each fed token
        want_embeds = torch.cat([step[0][0] for step in out.hidden_states])
        # Every computed position: the prompt and the generated tokens fed back (not the last one).
        assert hidden.shape == want_hidden.shape == (len(prompt) + NEW - 1, hf.config.hidden_size)
        torch.testing.assert_close(hidden, want_hidden, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(embeds, want_embeds)


def test_return_hidden_states_must_be_a_bool() -> None:
    with pytest.raises(InvalidRequest, match="return_hidden_states"):
        SamplingParams(return_hidden_states="yes")  # type: ignore[arg-type]
