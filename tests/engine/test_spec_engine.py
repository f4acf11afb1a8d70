"""Speculative decoding through the whole engine over tiny random Llamas on the CPU: greedy output token for
token as without speculation, whatever the drafts; KV blocks all returned; stops, max_tokens, constraints,
logprobs and aborts inside a speculated window."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.sampling_params import StructuredOutputs

from tests.harness.checkpoints import save_tiny_checkpoint

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The target, and a draft of the same shape with other random weights (it rarely agrees)."""
    target, other = tmp_path_factory.mktemp("spec-target"), tmp_path_factory.mktemp("spec-other")
    save_tiny_checkpoint("llama", target, seed=0)
    save_tiny_checkpoint("llama", other, seed=1)
    return target, other


def prompts() -> list[list[int]]:
    shared = [3 + (i * 11) % 300 for i in range(20)]
    return [
        shared + [5, 6, 7, 5, 6, 7],
        shared + [9],
        [7, 8, 9, 10, 7, 8, 9, 10],
        [40, 41],
        [100 + i for i in range(30)],
    ]


def greedy(max_tokens: int = NEW_TOKENS, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def build(target: Path, spec: dict[str, Any] | None, **kw: Any) -> LLM:
    return LLM(model=str(target), device="cpu", dtype="float32", max_model_len=128, speculative_config=spec, **kw)


def specs(models: tuple[Path, Path]) -> dict[str, dict[str, Any]]:
    target, other = models
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        "draft-agrees": {"method": "draft_model", "model": str(target), "num_speculative_tokens": 3},
        "draft-disagrees": {"method": "draft_model", "model": str(other), "num_speculative_tokens": 3},
    }


@pytest.fixture(scope="module")
def reference(models: tuple[Path, Path]) -> list[list[int]]:
    llm = build(models[0], None)
    return [o.outputs[0].token_ids for o in llm.generate(prompts(), greedy())]


def assert_all_blocks_back(llm: LLM, free_before: int) -> None:
    assert llm.engine.scheduler.kv.num_free_blocks == free_before
    proposer = llm.engine.speculator.proposer
    if proposer.name == "draft_model":
        assert proposer.kv.num_free_blocks == proposer.kv.num_blocks
        assert not proposer._shadows


@pytest.mark.parametrize("kind", ["ngram", "draft-agrees", "draft-disagrees"])
@pytest.mark.parametrize(
    "engine_args",
    [{}, {"num_kv_blocks": 20, "max_num_batched_tokens": 24}, {"enable_prefix_caching": False, "max_num_seqs": 2}],
    ids=["roomy", "tight", "no-prefix-cache"],
)
def test_greedy_output_is_that_of_decoding_without_drafts(
    models: tuple[Path, Path], reference: list[list[int]], kind: str, engine_args: dict[str, Any]
) -> None:
    llm = build(models[0], specs(models)[kind], **engine_args)
    free = llm.engine.scheduler.kv.num_free_blocks
    got = [o.outputs[0].token_ids for o in llm.generate(prompts(), greedy())]
    assert got == reference
    stats = llm.engine.stats()
    assert stats["spec_draft_tokens"] > 0
    if kind == "draft-agrees":
        assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"]
    if kind == "draft-disagrees":
        assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    assert not llm.engine.pipelined
    assert_all_blocks_back(llm, free)


def test_prefix_cache_hashes_only_accepted_tokens(models: tuple[Path, Path], reference: list[list[int]]) -> None:
    llm = build(models[0], specs(models)["draft-disagrees"])
    first = [o.outputs[0].token_ids for o in llm.generate(prompts(), greedy())]
    # A prompt made of a first answer: its blocks were filled during speculation and must be reused as they are.
    again = [p + out[:-1] for p, out in zip(prompts(), first)]
    hits_before = llm.engine.stats()["prefix_cache_hit_tokens"]
    second = [o.outputs[0].token_ids for o in llm.generate(again, greedy(4))]
    assert llm.engine.stats()["prefix_cache_hit_tokens"] > hits_before
    plain = build(models[0], None, enable_prefix_caching=False)
    assert second == [o.outputs[0].token_ids for o in plain.generate(again, greedy(4))]
    assert first == reference


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 6, 7])
def test_max_tokens_is_exact_inside_a_window(
    models: tuple[Path, Path], reference: list[list[int]], max_tokens: int
) -> None:
    llm = build(models[0], specs(models)["draft-agrees"])
    outs = llm.generate(prompts(), greedy(max_tokens))
    assert [o.outputs[0].token_ids for o in outs] == [r[:max_tokens] for r in reference]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_a_stop_token_inside_a_window_cuts_it(models: tuple[Path, Path], reference: list[list[int]]) -> None:
    llm = build(models[0], specs(models)["draft-agrees"])
    free = llm.engine.scheduler.kv.num_free_blocks
    stop = reference[0][5]
    cut = reference[0].index(stop)
    out = llm.generate([prompts()[0]], greedy(stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == reference[0][: cut + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    text = llm.get_tokenizer().decode(reference[0][: cut + 1])
    stop_text = text[-3:]
    by_string = llm.generate([prompts()[0]], greedy(stop=[stop_text]))[0].outputs[0]
    plain = build(models[0], None).generate([prompts()[0]], greedy(stop=[stop_text]))[0].outputs[0]
    assert by_string.finish_reason == "stop" and stop_text not in by_string.text
    assert (by_string.token_ids, by_string.text) == (plain.token_ids, plain.text)
    assert len(by_string.token_ids) < NEW_TOKENS
    assert_all_blocks_back(llm, free)


def test_logprobs_are_those_without_drafts(models: tuple[Path, Path]) -> None:
    params = greedy(8, logprobs=2)
    plain = build(models[0], None).generate(prompts()[:2], params)
    spec = build(models[0], specs(models)["draft-agrees"]).generate(prompts()[:2], params)
    for a, b in zip(plain, spec):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs or [], b.outputs[0].logprobs or [], strict=True):
            assert x.token_id == y.token_id and x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]


@pytest.mark.parametrize("kind", ["ngram", "draft-disagrees"])
def test_constrained_output_with_drafts(models: tuple[Path, Path], kind: str) -> None:
    constraint = StructuredOutputs(regex=r"[a-c]{2,6}-\d{2,3}")
    params = SamplingParams(temperature=0.0, max_tokens=20, structured_outputs=constraint)
    plain = [o.outputs[0].text for o in build(models[0], None).generate(prompts(), params)]
    llm = build(models[0], specs(models)[kind])
    free = llm.engine.scheduler.kv.num_free_blocks
    spec = [o.outputs[0].text for o in llm.generate(prompts(), params)]
    assert spec == plain
    assert all(re.fullmatch(r"[a-c]{2,6}-\d{2,3}", t) for t in spec)
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=20, structured_outputs=constraint)
    assert all(re.fullmatch(r"[a-c]{2,6}-\d{2,3}", o.outputs[0].text) for o in llm.generate(prompts(), sampled))
    assert_all_blocks_back(llm, free)


def test_abort_mid_request_returns_its_blocks(models: tuple[Path, Path], reference: list[list[int]]) -> None:
    llm = build(models[0], specs(models)["draft-disagrees"])
    engine = llm.engine
    free = engine.scheduler.kv.num_free_blocks
    engine.add_request("gone", prompts()[0], greedy())
    engine.add_request("kept", prompts()[2], greedy())
    for _ in range(4):
        engine.step()
    engine.abort("gone")
    while engine.has_unfinished():
        engine.step()
    done = {o.request_id: o for o in engine.pop_finished()}
    assert done["gone"].outputs[0].finish_reason == "abort"
    assert done["kept"].outputs[0].token_ids == reference[2]
    assert_all_blocks_back(llm, free)


def test_sampled_requests_run_and_keep_their_limits(models: tuple[Path, Path]) -> None:
    llm = build(models[0], specs(models)["draft-disagrees"])
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=9, ignore_eos=True)
    outs = llm.generate(prompts(), params)
    assert all(len(o.outputs[0].token_ids) == 9 for o in outs)
    # Seeded draws follow the drafts scored, which follow the acceptance measured so far: a fresh engine of
    # the same configuration draws the same tokens.
    again = build(models[0], specs(models)["draft-disagrees"]).generate(prompts(), params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in again]


def test_a_warmed_up_engine_speculates_over_its_fresh_kv_cache(
    models: tuple[Path, Path], reference: list[list[int]]
) -> None:
    from omni_gateway.engine.runner.warmup import warm_up_engine

    llm = build(models[0], specs(models)["draft-disagrees"])
    warm_up_engine(llm.engine, "minimal")
    free = llm.engine.scheduler.kv.num_free_blocks
    assert [o.outputs[0].token_ids for o in llm.generate(prompts(), greedy())] == reference
    assert_all_blocks_back(llm, free)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["ngram", "draft-agrees", "draft-disagrees"])
def test_greedy_output_on_cuda_is_that_without_drafts(models: tuple[Path, Path], kind: str) -> None:
    """On CUDA the verify step replays a prefill graph (or runs eagerly); one-token steps keep the decode graphs."""
    args: dict[str, Any] = {"device": "cuda", "dtype": "float32"}
    plain = LLM(model=str(models[0]), max_model_len=128, **args)
    reference = [o.outputs[0].token_ids for o in plain.generate(prompts(), greedy())]
    del plain
    llm = LLM(model=str(models[0]), max_model_len=128, speculative_config=specs(models)[kind], **args)
    free = llm.engine.scheduler.kv.num_free_blocks
    assert [o.outputs[0].token_ids for o in llm.generate(prompts(), greedy())] == reference
    assert_all_blocks_back(llm, free)
