"""Cached numpy rows of block tables against the tables themselves, through growth, preemption and release."""

from __future__ import annotations

import random

import numpy as np
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.runner.block_table_rows import BlockTableRows
from omni_gateway.engine.sampling_params import SamplingParams

BS = 4


def test_rows_follow_tables_through_growth_and_preemption_by_the_kv_manager() -> None:
    rng = random.Random(0)
    kv = KVCacheManager(400, BS, enable_prefix_caching=False)
    seqs = [
        Sequence(f"r{i}", [rng.randrange(50) for _ in range(rng.randrange(1, 30))], SamplingParams()) for i in range(6)
    ]
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


def test_decode_inputs_are_packed_per_sequence_with_padding_rows() -> None:
    import pytest
    from omni_gateway.engine.runner.graphed_decode import pack_decode_inputs

    kv = KVCacheManager(64, BS, enable_prefix_caching=False)
    seqs = [Sequence(f"r{i}", list(range(10 + i, 10 + i + n)), SamplingParams()) for i, n in enumerate((5, 9, 2))]
    for seq in seqs:
        assert kv.allocate_slots(seq, len(seq))
        seq.num_computed_tokens = len(seq) - 1  # each decodes its last token
    rows = np.full((4, 4), 99, dtype=np.int64)
    tables = np.full((4, 3), -7, dtype=np.int32)
    table_rows = BlockTableRows()
    pack_decode_inputs(seqs, rows, tables, BS, table_rows, bucket=4)
    for i, seq in enumerate(seqs):
        pos = len(seq) - 1
        assert rows[i].tolist() == [seq.token_ids[pos], pos, seq.block_table[pos // BS] * BS + pos % BS, pos + 1]
        assert tables[i, : len(seq.block_table)].tolist() == seq.block_table
    assert rows[3].tolist() == [0, 0, -1, 0]  # padding: no KV write, no context
    seqs[0].num_computed_tokens = len(seqs[0])  # nothing left to decode
    with pytest.raises(ValueError, match="cannot decode position 5: 5 tokens, 2 KV blocks"):
        pack_decode_inputs(seqs, rows, tables, BS, table_rows, bucket=4)


def test_a_step_ahead_packs_the_position_after_the_one_in_flight_with_its_id_on_the_device() -> None:
    import pytest
    from omni_gateway.engine.runner.graphed_decode import pack_decode_inputs

    kv = KVCacheManager(64, BS, enable_prefix_caching=False)
    seqs = [Sequence(f"r{i}", list(range(10 + i, 10 + i + n)), SamplingParams()) for i, n in enumerate((4, 6))]
    for seq in seqs:
        seq.num_computed_tokens = len(seq) - 1  # the step in flight decodes the last token
        assert kv.allocate_slots(seq, 2)  # and the slot after it
    rows = np.full((2, 4), 99, dtype=np.int64)
    tables = np.full((2, 3), -7, dtype=np.int32)
    pack_decode_inputs(seqs, rows, tables, BS, BlockTableRows(), bucket=2, ahead=True)
    for i, seq in enumerate(seqs):
        pos = len(seq)  # its token is the one in flight
        assert rows[i].tolist() == [-1, pos, seq.block_table[pos // BS] * BS + pos % BS, pos + 1]
    seqs[0].num_computed_tokens -= 1  # two tokens behind: not the position after the one in flight
    with pytest.raises(ValueError, match="cannot decode position 3 ahead: 4 tokens"):
        pack_decode_inputs(seqs, rows, tables, BS, BlockTableRows(), bucket=2, ahead=True)
