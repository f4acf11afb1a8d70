"""Cached numpy rows of block tables against the tables themselves, through growth, preemption and release."""
from __future__ import annotations

import random

import numpy as np

from engine.block_table_rows import BlockTableRows
from engine.kv_cache_manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

BS = 4


def test_rows_follow_tables_through_growth_and_preemption_by_the_kv_manager() -> None:
    rng = random.Random(0)
    kv = KVCacheManager(400, BS, enable_prefix_caching=False)
    seqs = [Sequence(f"r{i}", [rng.randrange(50) for _ in range(rng.randrange(1, 30))], SamplingParams())
            for i in range(6)]
    for seq in seqs:
        assert kv.allocate_slots(seq, len(seq))
        seq.num_computed_tokens = len(seq)
    rows = BlockTableRows()
    for step in range(300):
        seq = rng.choice(seqs)
        if rng.random() < 0.05:  # preempted: emptied, then admitted again onto other blocks
            kv.free(seq)
            seq.num_computed_tokens = 0
            assert kv.allocate_slots(seq, len(seq))
            seq.num_computed_tokens = len(seq)
        else:  # one more token, sometimes a new block
            seq.token_ids.append(7)
            assert kv.allocate_slots(seq, 1)
            seq.num_computed_tokens = len(seq)
        for s in seqs:
            row = rows.row(s)
            assert row.dtype == np.int32
            assert row.tolist() == s.block_table, (step, s)
    assert len(rows) == len(seqs)
    rows.release([seqs[0].seq_id, seqs[1].seq_id, 10**9])
    assert len(rows) == len(seqs) - 2


def test_an_emptied_table_that_regrows_to_the_same_length_is_read_again() -> None:
    kv = KVCacheManager(64, BS, enable_prefix_caching=False)
    seq = Sequence("r", list(range(9)), SamplingParams())
    other = Sequence("o", list(range(9)), SamplingParams())
    assert kv.allocate_slots(seq, 9)
    rows = BlockTableRows()
    before = rows.row(seq).tolist()
    kv.free(seq)
    assert kv.allocate_slots(other, 9)  # takes the freed blocks first
    assert kv.allocate_slots(seq, 9)
    assert len(seq.block_table) == len(before) and seq.block_table != before
    assert rows.row(seq).tolist() == seq.block_table
