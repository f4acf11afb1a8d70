"""The target rows kept for a proposer stay bounded per sequence: a sequence that goes unproposed for many
steps keeps only its most recent rows, unbroken, and hands them out from where they start."""

from __future__ import annotations

import torch
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.aux_hidden import AuxHiddenStore
from omni_gateway.engine.sampling_params import SamplingParams

LAYERS, HIDDEN = 3, 4


def rows_at(positions: range) -> torch.Tensor:
    """Rows whose every feature is their position, so a handed-out row says where it came from."""
    return torch.tensor(list(positions), dtype=torch.float32)[:, None, None].expand(-1, LAYERS, HIDDEN).clone()


def step(store: AuxHiddenStore, seq: Sequence, n: int) -> None:
    start = seq.num_computed_tokens
    store.record(ScheduledBatch([seq], [n], []), rows_at(range(start, start + n)))
    seq.num_computed_tokens += n


def test_an_unproposed_sequence_keeps_its_recent_rows_only() -> None:
    store = AuxHiddenStore(max_rows=8)
    seq = Sequence("r", list(range(300)), SamplingParams(temperature=0.0))
    step(store, seq, 20)  # a prompt chunk longer than the window keeps its tail
    assert store.num_rows(seq.seq_id) == 8
    most = 0
    for _ in range(200):  # decode steps with no proposal request
        step(store, seq, 1)
        most = max(most, store.num_rows(seq.seq_id))
    assert 8 <= store.num_rows(seq.seq_id) and most <= 16
    aux = store.take(seq.seq_id, seq.num_computed_tokens)
    assert aux is not None
    assert aux.first_position + aux.num_positions == seq.num_computed_tokens
    torch.testing.assert_close(aux.rows, rows_at(range(aux.first_position, seq.num_computed_tokens)))
    assert store.num_rows(seq.seq_id) == 0


def test_rows_within_the_window_are_all_handed_out() -> None:
    store = AuxHiddenStore(max_rows=8)
    seq = Sequence("r", list(range(30)), SamplingParams(temperature=0.0))
    step(store, seq, 6)
    for _ in range(4):
        step(store, seq, 1)
    aux = store.take(seq.seq_id, seq.num_computed_tokens)
    assert aux is not None and aux.first_position == 0
    torch.testing.assert_close(aux.rows, rows_at(range(10)))
