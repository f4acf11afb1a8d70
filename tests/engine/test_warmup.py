"""The start-up warm-up: which step shapes it runs, and that it leaves the engine as it was built."""

from __future__ import annotations

from pathlib import Path

import pytest
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.runner.warmup import plan, sampler_variants, warm_up_engine

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.engine_fakes import make_engine

LIMITS = {
    "vocab_size": 500,
    "max_model_len": 512,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 128,
    "block_size": 16,
    "kv_tokens": 64 * 16,
}


def test_full_plan_walks_contexts_and_batch_sizes_with_cached_prefixes_mixed_steps_and_sampler_paths() -> None:
    phases = plan("full", **LIMITS, graph_buckets=(1, 2, 4, 8))
    prefill = [len(p.prompts[0]) for p in phases if p.name.startswith("prefill")]
    assert prefill == [16, 32, 64, 128, 256, 512 - 3 - 1 - 16]  # past the budget of 128: chunked prefill
    grid = [p for p in phases if "decodes over" in p.name]
    assert {len(p.prompts) for p in grid} == {1, 2, 3, 4, 6, 8, 9, 12, 16}  # 9: past the largest graph bucket
    for phase in grid:
        prefix = next(p.prompts[0] for p in phases if p.name == f"prefill {len(phase.prompts[0]) - 16} tokens")
        assert all(prompt[: len(prefix)] == prefix for prompt in phase.prompts)  # decoders hit the cached prefix
        assert len({prompt[len(prefix) :] for prompt in phase.prompts}) == len(phase.prompts)  # own tails
        assert len(phase.late) == 1  # a prefill joining their decode steps
    assert {len(p.prompts[0]) - 16 for p in grid} == set(prefill)
    sampled = [params for p in phases if p.name.startswith("sampler") for params in p.params]
    assert all(variant in sampled for variant in sampler_variants())
    everything = [tok for p in phases for prompt in p.prompts + p.late for tok in prompt]
    assert max(everything) < LIMITS["vocab_size"] and min(everything) >= 0


def test_plan_respects_the_context_and_the_kv_capacity() -> None:
    kv_tokens = 12 * 16
    for caching in (True, False):
        phases = plan("full", **{**LIMITS, "max_model_len": 40, "kv_tokens": kv_tokens}, prefix_caching=caching)
        assert phases
        for phase in phases:
            prompts = phase.prompts + phase.late
            assert all(len(p) + 3 < 40 for p in prompts), phase.name
            blocks = sum(-(-(len(p) + 5) // 16) for p in prompts)
            if caching and "decodes over" in phase.name:  # the decoders share their prompt's full blocks
                blocks -= (len(phase.prompts) - 1) * ((len(phase.prompts[0]) - 16) // 16)
            assert blocks * 16 <= kv_tokens, phase.name


def test_minimal_and_off_plans_and_a_bad_mode() -> None:
    assert len(plan("minimal", **LIMITS)) == 1
    assert plan("off", **LIMITS) == []
    with pytest.raises(ValueError, match="warm-up mode must be"):
        plan("sometimes", **LIMITS)


def test_warm_up_runs_mixed_and_cached_steps_then_forgets_them() -> None:
    engine = make_engine(max_num_seqs=8, max_num_batched_tokens=64, num_kv_blocks=64)
    before, row_blocks = engine.stats(), engine.scheduler.kv.max_row_blocks
    assert row_blocks > 0
    seen: list[tuple[int, int, str]] = []
    hits: list[int] = []

    def progress(done: int, total: int, name: str) -> None:
        seen.append((done, total, name))
        hits.append(engine.scheduler.kv.prefix_hit_tokens)

    report = warm_up_engine(engine, "full", progress=progress)
    assert hits[-1] > 0  # decoders reused their context's cached prefix
    batches = engine.runner.batches  # type: ignore[attr-defined]
    assert report.steps == len(batches) and report.phases == len(seen) == seen[-1][1]
    assert any(any(n == 1 for *_, n in b) and any(n > 1 for *_, n in b) for b in batches)  # mixed steps
    assert max(len(b) for b in batches) == 8
    assert engine.scheduler.kv.prefix_hit_tokens == 0 and engine.scheduler.kv.pool.num_cached_blocks == 0
    assert engine.scheduler.kv.max_row_blocks == row_blocks  # cached blocks still keep hidden states
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


def test_plan_adds_a_batch_size_for_each_decode_launch_the_grid_misses() -> None:
    def key(batch: int, context: int) -> tuple[int, int]:
        return (3 if 17 <= batch <= 22 else 0, min(context, 64))  # a kernel variant no grid size hits

    limits = {**LIMITS, "max_num_seqs": 32, "kv_tokens": 1 << 16}
    plain = plan("full", **limits)
    keyed = plan("full", **limits, launch_key=key)
    decodes = [p for p in keyed if "decodes over" in p.name]
    assert {len(p.prompts) for p in decodes} - {len(p.prompts) for p in plain if "decodes over" in p.name} == {17}
    # One more phase per context, and nothing else changes.
    assert len(keyed) - len(plain) == len({p.name.split(" over ")[1] for p in decodes})
