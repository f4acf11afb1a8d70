from __future__ import annotations

import itertools
from typing import Any

import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.scheduler import Scheduler, token_stop
from omni_gateway.engine.core.sequence import FinishReason, ScheduledBatch, Sequence, SequenceStatus
from omni_gateway.engine.errors import EngineOverloaded
from omni_gateway.engine.sampling_params import SamplingParams

BS = 4
_next_token = itertools.count(100_000)
_prompt_base = itertools.count(1, 1000)


def make(num_blocks: int = 64, **config: Any) -> Scheduler:
    cfg = EngineConfig(block_size=BS, num_kv_blocks=num_blocks, **config)
    return Scheduler(cfg, KVCacheManager(num_blocks, BS))


def seq(
    n: int, *, priority: int = 0, max_tokens: int | None = 100, rid: str = "r", base: int | None = None, **params: Any
) -> Sequence:
    """A prompt of n tokens; distinct from every other prompt unless ``base`` repeats."""
    start = next(_prompt_base) if base is None else base
    return Sequence(
        rid,
        list(range(start, start + n)),
        SamplingParams(max_tokens=max_tokens, **params),
        priority=priority,
        eos_token_ids=frozenset({0}),
    )


def step(s: Scheduler) -> ScheduledBatch:
    """Schedule, check the block invariant, and feed back one token per sequence that reached its end."""
    batch = s.schedule()
    for q, n in zip(batch.seqs, batch.num_new_tokens):
        assert len(q.block_table) == -(-(q.num_computed_tokens + n) // BS)
    tokens = [
        next(_next_token) if q.num_computed_tokens + n == len(q) else None
        for q, n in zip(batch.seqs, batch.num_new_tokens)
    ]
    s.update_from_output(batch, tokens)
    return batch


def test_running_decodes_first_then_chunked_prefill_under_one_budget() -> None:
    s = make(max_num_batched_tokens=10)
    a = seq(6)
    s.add(a)
    first = step(s)
    assert first.num_new_tokens == [6] and len(a) == 7
    b = seq(30)
    s.add(b)
    batch = step(s)
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 9]
    assert b.num_computed_tokens == 9 and len(b) == 30  # mid-prefill: no token sampled
    batch = step(s)
    assert batch.num_new_tokens == [1, 9] and batch.total_tokens <= 10
    step(s)
    batch = step(s)
    assert batch.num_new_tokens == [1, 3] and len(b) == 31  # the last chunk samples b's first token
    batch = step(s)
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 1]


def test_waiting_order_is_priority_then_arrival() -> None:
    s = make(max_num_batched_tokens=4)
    bulk = seq(4, priority=1, rid="bulk")
    early = seq(4, rid="early")
    late = seq(4, rid="late")
    for q in (bulk, early, late):
        s.add(q)
    assert step(s).seqs == [early]
    assert step(s).seqs == [early, late]  # one decode token, then late's 3-token chunk
    assert bulk.status is SequenceStatus.WAITING


def test_bounded_waiting_queue_rejects_with_the_limit() -> None:
    s = make(max_waiting_requests=2)
    s.add(seq(3))
    s.add(seq(3))
    with pytest.raises(EngineOverloaded, match="max_waiting_requests=2"):
        s.add(seq(3))
    assert s.num_waiting == 2


def test_max_num_seqs_caps_running() -> None:
    s = make(max_num_seqs=2)
    for _ in range(3):
        s.add(seq(3))
    step(s)
    assert s.num_running == 2 and s.num_waiting == 1


def test_preemption_frees_the_latest_lowest_priority_sequence() -> None:
    s = make(num_blocks=4)
    urgent = seq(7, rid="urgent")  # 2 blocks each; growing past 8 tokens needs a third
    bulk = seq(7, priority=1, rid="bulk")
    s.add(bulk)
    s.add(urgent)
    step(s)
    assert s.kv.num_free_blocks == 0
    step(s)  # both reach 8 tokens... then one more token each needs a block
    batch = step(s)
    assert batch.preempted == [bulk] and batch.seqs == [urgent]
    assert bulk.status is SequenceStatus.WAITING and bulk.num_computed_tokens == 0
    assert bulk.num_preemptions == 1 and bulk.block_table == [] and s.num_preemptions == 1
    assert s.waiting[0] is bulk and len(bulk) == 9  # its sampled tokens stay; it recomputes them


def test_preempted_sequence_goes_before_newer_waiting_ones() -> None:
    s = make(num_blocks=4)
    a, b = seq(7, rid="a"), seq(7, rid="b")
    s.add(a)
    s.add(b)
    for _ in range(3):
        step(s)
    assert b.num_preemptions == 1
    newcomer = seq(2, rid="new")
    s.add(newcomer)
    assert s.waiting == [b, newcomer]


def test_lone_sequence_preempts_itself_only_if_it_cannot_fit() -> None:
    s = make(num_blocks=2)
    a = seq(7)
    s.add(a)
    for _ in range(2):
        step(s)
    assert len(a) == 9 and a.num_computed_tokens == 8
    batch = step(s)  # 9 tokens need 3 blocks: impossible
    assert batch.preempted == [a] and not batch.seqs


def test_abort_waiting_and_running_frees_all_blocks() -> None:
    s = make(max_num_batched_tokens=8)
    running, chunking, waiting = seq(5, rid="run"), seq(20, rid="chunk"), seq(5, rid="wait")
    for q in (running, chunking, waiting):
        s.add(q)
    step(s)
    assert running.status is SequenceStatus.RUNNING and chunking.num_computed_tokens == 3
    assert waiting.status is SequenceStatus.WAITING
    assert s.abort("chunk") == [chunking]
    assert s.abort("wait") == [waiting]
    assert s.abort("run") == [running]
    assert s.abort("unknown") == []
    assert s.kv.num_used_blocks == 0 and not s.has_unfinished()
    assert {q.finish_reason for q in (running, chunking, waiting)} == {FinishReason.ABORT}


def test_prefix_hit_on_admission_skips_cached_tokens() -> None:
    s = make()
    a = seq(10, max_tokens=1, base=7)
    s.add(a)
    step(s)
    assert a.is_finished and s.kv.num_used_blocks == 0
    b = seq(10, base=7)
    s.add(b)
    batch = step(s)
    assert b.num_cached_tokens == 8 and batch.num_new_tokens == [2]


def test_finished_sequences_release_blocks() -> None:
    s = make()
    a = seq(5, max_tokens=2)
    s.add(a)
    step(s)
    step(s)
    assert a.finish_reason is FinishReason.LENGTH and s.kv.num_used_blocks == 0 and not s.has_unfinished()


@pytest.mark.parametrize(
    ("tokens", "params", "expected"),
    [
        ([0], {}, (FinishReason.STOP, None)),
        ([0], {"ignore_eos": True}, None),
        ([0], {"min_tokens": 2}, None),
        ([5, 0], {"min_tokens": 2}, (FinishReason.STOP, None)),
        ([7], {"stop_token_ids": (7,)}, (FinishReason.STOP, 7)),
        ([5, 6], {"max_tokens": 2}, (FinishReason.LENGTH, None)),
        ([5], {"max_tokens": 2}, None),
    ],
)
def test_token_stop(
    tokens: list[int], params: dict[str, Any], expected: tuple[FinishReason, int | None] | None
) -> None:
    q = Sequence("r", [1, 2], SamplingParams(**params), eos_token_ids=frozenset({0}))
    q.token_ids.extend(tokens)
    assert token_stop(q) == expected


def test_token_stop_at_context_length() -> None:
    q = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=None), max_model_len=4)
    q.token_ids.append(9)
    assert token_stop(q) == (FinishReason.LENGTH, None)


def test_sequence_sharing_a_prefix_being_computed_waits_one_step_to_reuse_it() -> None:
    s = make()
    first, second = seq(10, base=500, rid="first"), seq(10, base=500, rid="second")
    other = seq(10, rid="other")
    for q in (first, second, other):
        s.add(q)
    batch = step(s)
    assert batch.seqs == [first, other]  # second skipped: its blocks are being filled right now
    batch = step(s)
    assert batch.seqs == [first, other, second] and batch.num_new_tokens == [1, 1, 2]
    assert second.num_cached_tokens == 8


def test_short_prompts_without_a_full_block_are_not_held_back() -> None:
    s = make()
    a, b = seq(4, base=700), seq(4, base=700)  # the last token is never cached: nothing to share
    s.add(a)
    s.add(b)
    assert step(s).seqs == [a, b]
