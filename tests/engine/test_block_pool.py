from __future__ import annotations

import pytest
from omni_gateway.engine.core.block_pool import BlockPool, hash_block
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.sequence import EmbedSpan, Sequence
from omni_gateway.engine.sampling_params import SamplingParams

BS = 4


def seq_of(tokens: list[int], spans: tuple[EmbedSpan, ...] = ()) -> Sequence:
    return Sequence("r", tokens, SamplingParams(), embed_spans=spans)


def admit(kv: KVCacheManager, seq: Sequence) -> int:
    """Admit like the scheduler does and compute the whole sequence; returns the cached-prefix length."""
    prefix = kv.find_cached_prefix(seq)
    assert kv.allocate_slots(seq, len(seq) - prefix.num_tokens, prefix)
    seq.num_computed_tokens = len(seq)
    kv.cache_full_blocks(seq)
    return prefix.num_tokens


def test_chain_hash_depends_on_parent_tokens_and_extra_keys() -> None:
    a = hash_block(None, [1, 2, 3, 4])
    assert a == hash_block(None, [1, 2, 3, 4])
    assert a != hash_block(None, [1, 2, 3, 5])
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(None, [5, 6, 7, 8])
    assert hash_block(None, [1, 2, 3, 4], ("img-a",)) != hash_block(None, [1, 2, 3, 4], ("img-b",))
    assert hash_block(None, [1], ("ab", "c")) != hash_block(None, [1], ("a", "bc"))


def test_pool_lru_order_and_eviction_of_hashes() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    assert pool.num_free_blocks == 0 and pool.num_used_blocks == 4
    pool.register(blocks[0], b"h0")
    pool.release([blocks[2], blocks[0], blocks[3], blocks[1]])
    assert pool.free_order() == [2, 0, 3, 1]
    assert pool.lookup(b"h0") is blocks[0]  # freed but still findable
    # A hit on a free block takes it off the free list without disturbing the others' order.
    pool.touch([blocks[0]])
    assert pool.free_order() == [2, 3, 1] and blocks[0].ref_count == 1
    pool.release([blocks[0]])
    assert pool.free_order() == [2, 3, 1, 0]
    taken = pool.allocate(4)
    assert [b.block_id for b in taken] == [2, 3, 1, 0]
    assert pool.lookup(b"h0") is None and blocks[0].hash is None  # reuse evicted the hash
    with pytest.raises(ValueError, match="asked for 1 blocks but only 0 are free"):
        pool.allocate(1)


def test_release_more_than_taken_is_an_error() -> None:
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.release([block])
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release([block])


def test_allocation_is_all_or_nothing_and_never_more_than_needed() -> None:
    kv = KVCacheManager(5, BS)
    seq = seq_of(list(range(9)))  # 9 tokens -> 3 blocks
    assert kv.allocate_slots(seq, 9)
    assert len(seq.block_table) == 3 and kv.num_free_blocks == 2
    seq.num_computed_tokens = 9
    assert kv.allocate_slots(seq, 1)  # 10th token fits in block 3
    assert len(seq.block_table) == 3
    other = seq_of(list(range(100, 113)))  # 13 tokens -> 4 blocks, only 2 free
    assert not kv.allocate_slots(other, 13)
    assert other.block_table == [] and kv.num_free_blocks == 2
    third = seq_of(list(range(200, 208)))
    assert kv.allocate_slots(third, 8) and kv.num_free_blocks == 0
    assert kv.allocate_slots(seq, 3)  # tokens 10-12 still fit in the blocks it holds: no free block needed
    assert not kv.allocate_slots(seq, 4) and len(seq.block_table) == 3  # a 13th token would need a 4th
    kv.free(third)
    kv.free(seq)
    assert kv.num_used_blocks == 0 and seq.block_table == []


def test_prefix_hit_reuses_blocks_but_never_covers_the_last_token() -> None:
    kv = KVCacheManager(16, BS)
    first = seq_of(list(range(10)))
    assert admit(kv, first) == 0
    kv.free(first)
    assert kv.num_used_blocks == 0

    # Exactly two full blocks: the second cannot be a hit, the last token must be computed.
    again = seq_of(list(range(8)))
    prefix = kv.find_cached_prefix(again)
    assert prefix.num_tokens == 4
    assert kv.allocate_slots(again, 4, prefix)
    assert again.block_table[0] == prefix.blocks[0].block_id

    longer = seq_of(list(range(10)) + [50, 51, 52])
    assert kv.find_cached_prefix(longer).num_tokens == 8
    diverging = seq_of([0, 1, 2, 3, 99, 5, 6, 7, 8])
    assert kv.find_cached_prefix(diverging).num_tokens == 4
    assert kv.prefix_query_tokens == 10 + 8 and kv.prefix_hit_tokens == 4


def test_shared_prefix_blocks_are_ref_counted() -> None:
    kv = KVCacheManager(16, BS)
    a = seq_of(list(range(9)))
    admit(kv, a)
    b = seq_of(list(range(8)) + [77])
    assert admit(kv, b) == 8
    assert a.block_table[:2] == b.block_table[:2]
    assert kv.num_used_blocks == 4  # 2 shared + one tail each
    kv.free(a)
    assert kv.num_used_blocks == 3
    kv.free(b)
    assert kv.num_used_blocks == 0


def test_media_keys_separate_identical_placeholder_tokens() -> None:
    kv = KVCacheManager(16, BS)
    tokens = [5] * 8 + [1]
    admit(kv, seq_of(tokens, (EmbedSpan(0, 8, "cat.png", None),)))
    assert kv.find_cached_prefix(seq_of(tokens, (EmbedSpan(0, 8, "dog.png", None),))).num_tokens == 0
    assert kv.find_cached_prefix(seq_of(tokens, (EmbedSpan(0, 8, "cat.png", None),))).num_tokens == 8


def test_eviction_takes_oldest_freed_and_a_sequences_tail_first() -> None:
    kv = KVCacheManager(6, BS)
    old = seq_of(list(range(12)))  # blocks for [0..4), [4..8), [8..12)
    admit(kv, old)
    old_blocks = list(old.block_table)
    new = seq_of(list(range(100, 112)))
    admit(kv, new)
    new_blocks = list(new.block_table)
    kv.free(old)
    kv.free(new)
    assert kv.pool.free_order() == old_blocks[::-1] + new_blocks[::-1]

    # One block of pressure evicts the old sequence's last block only: its first 8 tokens still hit.
    filler = seq_of([200, 201, 202])
    assert kv.allocate_slots(filler, 3)
    assert filler.block_table == [old_blocks[2]]
    assert kv.find_cached_prefix(seq_of(list(range(12)) + [1])).num_tokens == 8
    assert kv.find_cached_prefix(seq_of(list(range(100, 112)) + [1])).num_tokens == 12


def test_usage_reports_allocated_slots_against_stored_tokens() -> None:
    kv = KVCacheManager(8, BS)
    a = seq_of(list(range(6)))
    assert kv.allocate_slots(a, 6)
    a.num_computed_tokens = 6
    u = kv.usage()
    assert (u.allocated_slots, u.stored_tokens, u.num_used_blocks) == (8, 6, 2)
    assert u.waste_fraction == pytest.approx(0.25)
    kv.cache_full_blocks(a)
    b = seq_of(list(range(4)) + [9, 9])
    assert admit(kv, b) == 4
    u = kv.usage()
    assert (u.allocated_slots, u.stored_tokens) == (12, 4 + 2 + 2)  # the shared block counts once


def test_disabled_prefix_caching_never_hits() -> None:
    kv = KVCacheManager(8, BS, enable_prefix_caching=False)
    admit(kv, seq_of(list(range(9))))
    assert kv.find_cached_prefix(seq_of(list(range(9)))).num_tokens == 0
    assert kv.pool.num_cached_blocks == 0


def hidden_seq(tokens: list[int]) -> Sequence:
    return Sequence("h", tokens, SamplingParams(return_hidden_states=True))


def compute_with_rows(kv: KVCacheManager, seq: Sequence, steps: list[int]) -> int:
    """Admit ``seq`` and compute it in steps of the given sizes, handing the KV cache each step's rows as the
    runner does (position labels stand in for hidden states); returns the cached-prefix length."""
    prefix = kv.find_cached_prefix(seq)
    assert kv.allocate_slots(seq, len(seq) - prefix.num_tokens, prefix)
    seq.num_computed_tokens = prefix.num_tokens
    for n in steps:
        first = seq.num_computed_tokens
        seq.pending_rows.append((first, [f"row{p}" for p in range(first, first + n)]))
        seq.num_computed_tokens += n
        kv.cache_full_blocks(seq)
    assert seq.num_computed_tokens == len(seq)
    return prefix.num_tokens


def test_hidden_state_requests_reuse_only_blocks_that_kept_their_rows() -> None:
    kv = KVCacheManager(16, BS, max_row_blocks=8)
    plain = seq_of(list(range(9)))
    admit(kv, plain)  # its blocks are cached without rows
    kv.free(plain)
    wants = hidden_seq(list(range(9)))
    assert kv.find_cached_prefix(wants).num_tokens == 0
    assert compute_with_rows(kv, wants, [3, 1, 1, 4]) == 0  # a prefill chunk, decodes, another chunk
    kv.free(wants)
    again = hidden_seq(list(range(9)) + [40, 41])
    assert compute_with_rows(kv, again, [3]) == 8
    # The prefix's rows, in pieces, cover positions 0..7 in order whichever steps computed them.
    assert [r for piece in again.prefix_rows for r in piece] == [f"row{p}" for p in range(8)]
    assert kv.find_cached_prefix(seq_of(list(range(9)))).num_tokens == 8  # plain requests still hit


def test_rows_are_kept_for_a_bounded_number_of_blocks_least_recently_used_first() -> None:
    kv = KVCacheManager(16, BS, max_row_blocks=2)
    a = hidden_seq(list(range(9)))
    compute_with_rows(kv, a, [9])  # blocks 0 and 1 keep rows
    kv.free(a)
    assert kv.find_cached_prefix(hidden_seq(list(range(9)))).num_tokens == 8
    b = hidden_seq([7] * 5)
    compute_with_rows(kv, b, [5])  # one more block with rows: a's least recently used one loses its rows
    kv.free(b)
    assert kv.pool.num_blocks_with_rows == 2
    assert kv.find_cached_prefix(hidden_seq(list(range(9)))).num_tokens == 0  # block 0's rows went first
    assert kv.find_cached_prefix(seq_of(list(range(9)))).num_tokens == 8  # its KV stays cached
    none = KVCacheManager(16, BS, max_row_blocks=0)
    compute_with_rows(none, hidden_seq(list(range(9))), [9])
    assert none.pool.num_blocks_with_rows == 0


def test_a_reused_block_drops_the_rows_of_its_old_contents() -> None:
    kv = KVCacheManager(3, BS, max_row_blocks=8)
    a = hidden_seq(list(range(9)))
    compute_with_rows(kv, a, [9])
    kv.free(a)
    b = seq_of([50 + i for i in range(9)])  # takes every block: the old hashes and rows are evicted
    admit(kv, b)
    assert kv.pool.num_blocks_with_rows == 0
    assert all(not block.rows for block in kv.pool.blocks)


def test_a_prefix_hit_keeps_its_rows_longest() -> None:
    kv = KVCacheManager(16, BS, max_row_blocks=2)
    a = hidden_seq(list(range(5)))
    compute_with_rows(kv, a, [5])  # block 0 of a keeps rows
    kv.free(a)
    b = hidden_seq([9] * 5)
    compute_with_rows(kv, b, [5])  # block 0 of b keeps rows: two blocks, a's the older
    kv.free(b)
    again = hidden_seq(list(range(5)) + [6])
    assert compute_with_rows(kv, again, [2]) == 4  # a hit on a's block makes it the most recently used
    kv.free(again)
    c = hidden_seq([3] * 5)
    compute_with_rows(kv, c, [5])  # a third block with rows: b's, now the least recently used, loses them
    kv.free(c)
    assert kv.find_cached_prefix(hidden_seq(list(range(5)))).num_tokens == 4
    assert kv.find_cached_prefix(hidden_seq([9] * 5)).num_tokens == 0


def test_position_keyed_spans_key_each_block_by_its_own_slice() -> None:
    """Rows keyed position by position (a talker's thinker states): two prompts whose spans end apart still
    share the blocks where their keys agree, and part where they differ."""

    def talker(keys: list[int]) -> Sequence:
        span = EmbedSpan(0, len(keys), "rows", None, position_keys=tuple(keys))
        return seq_of([0] * len(keys), (span,))

    kv = KVCacheManager(16, BS)
    first = talker([5, 6, 7, 8, 9, 10, 11, 12, 13])
    admit(kv, first)
    kv.free(first)
    assert kv.find_cached_prefix(talker([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])).num_tokens == 8  # a longer span
    assert kv.find_cached_prefix(talker([5, 6, 7, 8, 9, 10, 99, 12, 13])).num_tokens == 4  # differs in block 1
    assert kv.find_cached_prefix(talker([4, 6, 7, 8, 9, 10, 11, 12, 13])).num_tokens == 0
    whole = EmbedSpan(0, 9, "rows", None)  # one key over the span: only equal spans share
    assert kv.find_cached_prefix(seq_of([0] * 9, (whole,))).num_tokens == 0
