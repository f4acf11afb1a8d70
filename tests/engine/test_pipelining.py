"""Which decode steps may be launched ahead of the host (engine.core.pipelining), over the real scheduler."""

from __future__ import annotations

import itertools
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.pipelining import launchable
from omni_gateway.engine.core.scheduler import Scheduler
from omni_gateway.engine.core.sequence import FinishReason, ScheduledBatch, Sequence
from omni_gateway.engine.sampling_params import SamplingParams

BS = 4
_tokens = itertools.count(1000)


def make(num_blocks: int = 64, **config: Any) -> Scheduler:
    return Scheduler(EngineConfig(block_size=BS, num_kv_blocks=num_blocks, **config), KVCacheManager(num_blocks, BS))


def greedy(prompt_len: int = 6, max_model_len: int | None = None, **params: Any) -> Sequence:
    params.setdefault("temperature", 0.0)
    start = next(_tokens) * 100  # distinct prompts: no waiting on a shared prefix
    return Sequence("r", list(range(start, start + prompt_len)), SamplingParams(**params), max_model_len=max_model_len)


def admit(s: Scheduler, *seqs: Sequence) -> None:
    """Prefill ``seqs`` in one step and give each its first output token: next step they decode."""
    for seq in seqs:
        s.add(seq)
    batch = s.schedule()
    assert batch.seqs == list(seqs)
    s.update_from_output(batch, [next(_tokens) for _ in seqs])


def decoding(s: Scheduler, prompt_len: int = 6, **params: Any) -> Sequence:
    seq = greedy(prompt_len, **params)
    admit(s, seq)
    return seq


def test_a_decode_step_is_launchable_unless_its_tokens_need_more_than_the_logits() -> None:
    s = make()
    plain = decoding(s)
    assert launchable(s.schedule())
    s = make()
    decoding(s, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, seed=3)
    assert launchable(s.schedule())  # sampling happens on the device from the sequence's parameters
    for params in (
        {"logprobs": 2},
        {"logprobs": 0},
        {"repetition_penalty": 1.2},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"min_tokens": 3},
    ):
        s2 = make()
        decoding(s2, **params)
        assert not launchable(s2.schedule()), params
    # A prefill chunk (more than one token) or a one-token chunk before the prompt's end samples nothing.
    s3 = make(max_num_batched_tokens=3)
    s3.add(Sequence("p", list(range(1, 8)), SamplingParams(temperature=0.0)))
    assert not launchable(s3.schedule())
    assert not launchable(ScheduledBatch([plain], [2], []))
    assert not launchable(ScheduledBatch([], [], []))


def test_lookahead_decodes_every_running_sequence_and_allocates_its_next_slot() -> None:
    s = make()
    a, b = greedy(prompt_len=6), greedy(prompt_len=7)
    admit(s, a, b)
    in_flight = s.schedule()  # a decodes position 6, b position 7: both within 2 blocks
    assert launchable(in_flight) and in_flight.seqs == [a, b]
    blocks = [len(a.block_table), len(b.block_table)]
    ahead = s.schedule_lookahead(in_flight)
    assert ahead is not None and ahead.seqs == [a, b] and ahead.num_new_tokens == [1, 1]
    # Room for positions 7 and 8: a stays within its 2nd block, b starts a 3rd (positions 8-11).
    assert blocks == [2, 2] and [len(a.block_table), len(b.block_table)] == [2, 3]
    # Once the host reads the step in flight, the step ahead decodes exactly the next position.
    s.update_from_output(in_flight, [next(_tokens), next(_tokens)])
    assert all(q.num_computed_tokens + 1 == len(q) for q in ahead.seqs)


def test_lookahead_waits_for_the_host_where_it_would_schedule_differently() -> None:
    s = make()
    a = decoding(s)
    in_flight = s.schedule()
    s.add(Sequence("new", [5, 6, 7], SamplingParams(temperature=0.0)))
    assert s.schedule_lookahead(in_flight) is None  # the host's schedule admits the waiting request

    s = make()
    a, b = greedy(), greedy()
    admit(s, a, b)
    s.config = EngineConfig(block_size=BS, num_kv_blocks=64, max_num_batched_tokens=1)  # b left out
    in_flight = s.schedule()
    assert in_flight.seqs == [a]
    assert s.schedule_lookahead(in_flight) is None

    s = make()
    decoding(s, min_tokens=1)  # one output so far: nothing masked from here on
    in_flight = s.schedule()
    assert launchable(in_flight) and s.schedule_lookahead(in_flight) is not None
    s = make()
    decoding(s, min_tokens=2)  # the token in flight is the 2nd: EOS is still masked for it
    assert not launchable(s.schedule())


def test_sequences_certain_to_stop_on_length_and_finished_ones_are_left_out() -> None:
    s = make()
    stops = greedy(max_tokens=2)  # the token in flight is its 2nd and last
    goes_on = greedy(max_tokens=3)
    at_context_end = greedy(prompt_len=6, max_model_len=8)  # 7 tokens; the 8th, in flight, fills the context
    aborted = greedy()
    admit(s, stops, goes_on, at_context_end, aborted)
    in_flight = s.schedule()
    assert in_flight.seqs == [stops, goes_on, at_context_end, aborted]
    s.finish(aborted, FinishReason.ABORT)
    ahead = s.schedule_lookahead(in_flight)
    assert ahead is not None and ahead.seqs == [goes_on]
    # None left: nothing to launch.
    s = make()
    only = decoding(s, max_tokens=2)
    assert s.schedule_lookahead(s.schedule()) is None and only.num_output_tokens == 1


def test_lookahead_is_refused_when_the_pool_has_no_block_for_the_next_position() -> None:
    s = make(num_blocks=2)  # 8 slots: the prompt and first output fill positions 0-7
    seq = decoding(s, prompt_len=7)
    in_flight = s.schedule()  # decodes position 7, the last slot
    assert launchable(in_flight)
    assert s.schedule_lookahead(in_flight) is None and len(seq.block_table) == 2
