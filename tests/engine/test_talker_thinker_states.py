"""What a talker is conditioned on: the thinker's per-position hidden states and input embeddings,
returned by the engine with ``SamplingParams(return_hidden_states=True)``, against transformers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.engine_fakes import make_engine

NEW = 6


@pytest.mark.slow
def test_hidden_states_match_hf_generate(tmp_path: Path) -> None:
    hf = save_tiny_checkpoint("qwen2", tmp_path, seed=3)
    engine = LLMEngine(
        EngineConfig(
            model=str(tmp_path), device="cpu", attention_backend="torch", max_num_batched_tokens=8, block_size=8
        )
    )
    prompt = [5, 17, 42, 9, 11, 3, 77, 21, 8, 30, 2]
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, return_hidden_states=True)
    # A first request leaves the prompt's blocks in the prefix cache with their hidden states; the second
    # reuses them and still gets every position's rows.
    for rid, cached in (("first", 0), ("second", 8)):
        engine.add_request(rid, prompt, params)
        deltas = []
        while engine.has_unfinished():
            deltas += engine.step()
        starts = [d.hidden_start for d in deltas if d.hidden_states is not None]
        hidden = torch.cat([d.hidden_states for d in deltas if d.hidden_states is not None])
        embeds = torch.cat([d.input_embeds for d in deltas if d.input_embeds is not None])
        tokens = [t for d in deltas for t in d.token_ids]
        assert starts[0] == 0 and deltas[-1].num_cached_tokens == cached

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


def _run(engine: LLMEngine, rid: str, prompt: list[int], new: int, preempt_after: int | None = None):
    """Every delta's (hidden_start, hidden rows) and the tokens of one greedy request run alone."""
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, return_hidden_states=True)
    engine.add_request(rid, prompt, params)
    rows, tokens, cached, steps = [], [], 0, 0
    while engine.has_unfinished():
        if steps == preempt_after:
            engine.scheduler._preempt(engine.scheduler.running[0])  # as when the KV cache runs out
        for delta in engine.step():
            if delta.hidden_states is not None:
                rows.append((delta.hidden_start, delta.hidden_states))
            tokens += delta.token_ids
            cached = delta.num_cached_tokens
        steps += 1
    return rows, tokens, cached


def _engine(path: Path, **config: object) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model=str(path), device="cpu", attention_backend="torch", block_size=8, **config)  # type: ignore[arg-type]
    )


def _contiguous(rows: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    at = 0
    for start, block in rows:
        assert start == at, f"rows resume at {start}, expected {at}"
        at += len(block)
    return torch.cat([block for _, block in rows])


def test_a_later_turn_reuses_the_conversations_hidden_states(tmp_path: Path) -> None:
    """A spoken conversation's next turn extends the last: its prefix, the earlier reply included, comes from
    the cache with the hidden states kept there, equal to computing the whole turn again."""
    save_tiny_checkpoint("qwen2", tmp_path, seed=3)
    engine, fresh = _engine(tmp_path), _engine(tmp_path, enable_prefix_caching=False)
    turn1 = [5, 17, 42, 9, 11, 3, 77, 21, 8, 30, 2]
    rows1, reply, cached1 = _run(engine, "turn1", turn1, NEW)
    turn2 = turn1 + reply + [60, 61, 62, 63, 64]
    rows2, tokens2, cached2 = _run(engine, "turn2", turn2, NEW)
    want, want_tokens, _ = _run(fresh, "turn2", turn2, NEW)
    assert cached1 == 0 and cached2 == 16  # the 16 positions turn 1 computed: 11 prompt, 5 fed-back tokens
    hidden1, hidden2 = _contiguous(rows1), _contiguous(rows2)
    assert torch.equal(hidden2[:16], hidden1[:16])  # the very rows turn 1 computed
    assert tokens2 == want_tokens
    torch.testing.assert_close(hidden2, _contiguous(want), rtol=1e-4, atol=1e-4)


def test_a_preempted_request_sends_each_positions_rows_once(tmp_path: Path) -> None:
    save_tiny_checkpoint("qwen2", tmp_path, seed=3)
    prompt = [5, 17, 42, 9, 11, 3, 77, 21, 8, 30, 2, 14, 15]
    for cache in (True, False):  # recomputed from cached blocks, or from scratch
        rows, tokens, _ = _run(_engine(tmp_path, enable_prefix_caching=cache), "r", prompt, NEW, preempt_after=3)
        want_rows, want_tokens, _ = _run(_engine(tmp_path), "r", prompt, NEW)
        assert tokens == want_tokens
        torch.testing.assert_close(_contiguous(rows), _contiguous(want_rows), rtol=1e-4, atol=1e-4)


def test_rows_of_a_batch_with_requests_that_did_not_ask(tmp_path: Path) -> None:
    """A step whose sequences ask for rows around one that does not (their rows are not side by side in
    the step) gives each the rows it gets alone, with the input embeddings of its own tokens."""
    save_tiny_checkpoint("qwen2", tmp_path, seed=3)
    prompts = {"a": [5, 17, 42, 9, 11, 3, 77], "plain": [8, 30, 2, 14], "c": [21, 60, 61, 62, 63]}
    engine = _engine(tmp_path, enable_prefix_caching=False)
    for rid, prompt in prompts.items():
        engine.add_request(
            rid,
            prompt,
            SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, return_hidden_states=rid != "plain"),
        )
    rows: dict[str, list[tuple[int, torch.Tensor]]] = {rid: [] for rid in prompts}
    embeds: dict[str, list[torch.Tensor]] = {rid: [] for rid in prompts}
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.hidden_states is not None:
                rows[delta.request_id].append((delta.hidden_start, delta.hidden_states))
                embeds[delta.request_id].append(delta.input_embeds)
    assert not rows["plain"]
    embed = engine.runner.model.embed_tokens
    for rid in ("a", "c"):
        alone, tokens, _ = _run(_engine(tmp_path, enable_prefix_caching=False), rid, prompts[rid], NEW)
        torch.testing.assert_close(_contiguous(rows[rid]), _contiguous(alone), rtol=1e-5, atol=1e-5)
        fed = prompts[rid] + tokens[:-1]  # every computed position's token: the prompt, then each fed back
        torch.testing.assert_close(torch.cat(embeds[rid]), embed(torch.tensor(fed)).float())


def test_hidden_states_under_tensor_parallel_are_refused() -> None:
    """Only rank 0 hands rows out, and its input embeddings would wait on an all-reduce the other ranks never
    join: the request is refused instead of hanging the engine."""
    engine = make_engine(tensor_parallel_size=2)
    params = SamplingParams(max_tokens=2, return_hidden_states=True)
    with pytest.raises(InvalidRequest, match="return_hidden_states needs tensor_parallel_size 1"):
        engine.add_request("r", [5, 6, 7], params)
    engine.add_request("plain", [5, 6, 7], SamplingParams(max_tokens=2))  # other requests are served


@pytest.mark.slow
def test_a_chosen_layers_rows_at_the_prompt_match_hf(tmp_path: Path) -> None:
    """``hidden_layer``: the prompt's rows are that many layers' output (transformers' ``hidden_states[n]``),
    chunked prefill included; generated positions keep the final-normed state. Cached blocks are reused only
    where they kept rows of the kind asked: the same layer's, never the final-normed ones or another layer's."""
    hf = save_tiny_checkpoint("qwen2", tmp_path, seed=3)
    engine = LLMEngine(
        EngineConfig(
            model=str(tmp_path), device="cpu", attention_backend="torch", max_num_batched_tokens=8, block_size=8
        )
    )
    prompt = [5, 17, 42, 9, 11, 3, 77, 21, 8, 30, 2]
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW,
            do_sample=False,
            output_hidden_states=True,
            return_dict_in_generate=True,
            min_new_tokens=NEW,
        )
    layer = 1
    assert hf.config.num_hidden_layers > layer
    plain = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, return_hidden_states=True)
    at_layer = dataclasses.replace(plain, hidden_layer=layer)
    n = len(prompt)
    fed = torch.cat([step[-1][0] for step in out.hidden_states[1:]])
    got: dict[str, torch.Tensor] = {}
    cached = {"final": 0, "layer": 0, "layer-again": 8, "other-layer": 0, "final-again": 8}
    for rid, params in (
        ("final", plain),
        ("layer", at_layer),  # the first request's cached rows are final-normed ones
        ("layer-again", at_layer),  # the prompt's first block kept layer 1's rows
        ("other-layer", dataclasses.replace(plain, hidden_layer=layer + 1)),
        ("final-again", plain),  # the final-normed rows are kept still
    ):
        engine.add_request(rid, prompt, params)
        deltas = []
        while engine.has_unfinished():
            deltas += engine.step()
        got[rid] = torch.cat([d.hidden_states for d in deltas if d.hidden_states is not None])
        assert [t for d in deltas for t in d.token_ids] == out.sequences[0, len(prompt) :].tolist()
        assert deltas[-1].num_cached_tokens == cached[rid], rid
        assert [d.hidden_start for d in deltas if d.hidden_states is not None][0] == 0
    for rid, want in (("layer", layer), ("layer-again", layer), ("final", -1)):
        torch.testing.assert_close(got[rid][:n], out.hidden_states[0][want][0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[rid][n:], fed, rtol=1e-4, atol=1e-4)
    assert torch.equal(got["layer-again"][:8], got["layer"][:8])  # the very rows the first one computed
    assert torch.equal(got["final-again"][:8], got["final"][:8])
    assert not torch.allclose(got["layer"][:n], out.hidden_states[0][-1][0], atol=1e-3)
    assert not torch.allclose(got["other-layer"][:n], got["layer"][:n], atol=1e-3)
    deep = hf.config.num_hidden_layers + 1
    with pytest.raises(InvalidRequest, match=f"hidden_layer {deep} asked of a model with"):
        engine.add_request("deep", prompt, dataclasses.replace(plain, hidden_layer=deep))


def test_hidden_layer_needs_hidden_states() -> None:
    with pytest.raises(InvalidRequest, match="hidden_layer must be"):
        SamplingParams(hidden_layer=2)
