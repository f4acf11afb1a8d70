"""The start-up warm-up: which step shapes it runs, and that it leaves the engine as it was built."""

from __future__ import annotations

from pathlib import Path

import pytest
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.warmup import plan, sampler_variants, warm_up_engine

from benchmarks.checkpoints import save_tiny_checkpoint
from tests.engine.engine_fakes import make_engine

LIMITS = {
    "vocab_size": 500,
    "max_model_len": 512,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 128,
    "block_size": 16,
    "kv_tokens": 64 * 16,
}


def test_full_plan_covers_the_budget_cached_prefixes_decode_sizes_mixed_steps_and_every_sampler_path() -> None:
    phases = plan("full", **LIMITS, graph_buckets=(1, 2, 4, 8))
    prefill = [len(p.prompts[0]) for p in phases if p.name.startswith("prefill") and "cached" not in p.name]
    assert prefill[:4] == [16, 32, 64, 128] and prefill[-1] > 128  # past the budget: a chunked prompt
    cached = [p.prompts[0] for p in phases if "cached" in p.name]
    assert cached and all(a[:16] == b[:16] and a != b for a, b in zip(cached[::2], cached[1::2]))
    decode = [len(p.prompts) for p in phases if p.name.startswith("decode batch") and "over" not in p.name]
    assert decode == [1, 2, 4, 8, 16]  # 16 is past the largest graph bucket: the eager path
    mixed = [p for p in phases if p.late]
    assert mixed and all(len(p.prompts) >= 1 for p in mixed)
    sampled = [params for p in phases if p.name.startswith("sampler") for params in p.params]
    assert all(variant in sampled for variant in sampler_variants())
    everything = [tok for p in phases for prompt in p.prompts + p.late for tok in prompt]
    assert max(everything) < LIMITS["vocab_size"] and min(everything) >= 0


def test_plan_respects_the_context_and_the_kv_capacity() -> None:
    phases = plan("full", **{**LIMITS, "max_model_len": 40, "kv_tokens": 8 * 16})
    for phase in phases:
        assert all(len(p) + 3 < 40 for p in phase.prompts + phase.late), phase.name
        assert sum(len(p) + 3 for p in phase.prompts + phase.late) <= 8 * 16 or len(phase.prompts) == 1, phase.name


def test_minimal_and_off_plans_and_a_bad_mode() -> None:
    assert len(plan("minimal", **LIMITS)) == 1
    assert plan("off", **LIMITS) == []
    with pytest.raises(ValueError, match="warm-up mode must be one of"):
        plan("sometimes", **LIMITS)


def test_warm_up_runs_mixed_and_cached_steps_then_forgets_them() -> None:
    engine = make_engine(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64)
    before = engine.stats()
    seen: list[tuple[int, int, str]] = []
    report = warm_up_engine(engine, "full", progress=lambda done, total, name: seen.append((done, total, name)))
    batches = engine.runner.batches  # type: ignore[attr-defined]
    assert report.steps == len(batches) and report.phases == len(seen) == seen[-1][1]
    assert any(any(n == 1 for *_, n in b) and any(n > 1 for *_, n in b) for b in batches)  # mixed steps
    assert max(len(b) for b in batches) == 8
    assert engine.scheduler.kv.prefix_hit_tokens == 0 and engine.scheduler.kv.pool.num_cached_blocks == 0
    assert engine.stats() == before and not engine.has_unfinished() and engine.pop_finished() == []


def test_off_runs_nothing() -> None:
    engine = make_engine()
    assert warm_up_engine(engine, "off").steps == 0
    assert engine.runner.batches == []  # type: ignore[attr-defined]


def test_warm_up_refuses_a_busy_engine() -> None:
    engine = make_engine()
    engine.add_request("r", [5, 6, 7])
    with pytest.raises(RuntimeError, match="idle engine"):
        warm_up_engine(engine, "minimal")


@pytest.mark.slow
def test_real_runner_after_warm_up_samples_as_a_fresh_engine(tmp_path: Path) -> None:
    save_tiny_checkpoint("llama", tmp_path)
    args = {"device": "cpu", "dtype": "float32", "max_model_len": 96, "max_num_seqs": 4, "max_num_batched_tokens": 32}
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)  # unseeded: the shared generator
    prompts = [[5 + i, 9, 12 + i, 40] for i in range(3)]
    fresh = [o.outputs[0].token_ids for o in LLM(str(tmp_path), **args).generate(prompts, params)]
    warmed = LLM(str(tmp_path), **args)
    report = warm_up_engine(warmed.engine, "full")
    assert report.steps > 0
    assert [o.outputs[0].token_ids for o in warmed.generate(prompts, params)] == fresh
    assert warmed.engine.stats()["prefix_cache_hit_tokens"] == 0
