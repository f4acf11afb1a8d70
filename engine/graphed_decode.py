"""Pure-decode steps of a text model replayed from CUDA graphs, one per batch-size bucket.

The runner hands over a step's sequences; their token ids, positions, KV slots and context
lengths are packed into one pinned host buffer and their block tables into another, both staged
into the graphs' static buffers with one asynchronous copy each. The smallest fitting graph
replays the whole model forward, the LM head and a greedy argmax, and the logits and argmax of
the live rows come back as views of the graph's outputs (valid until the next replay).

Padding rows get KV slot -1 (the cache write skips it) and context length 0 (decode attention
answers zeros), so they neither read nor write live KV blocks. The block-table buffer is as wide
as the longest context the engine admits; entries past a sequence's context are never read.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from engine.attention import AttentionMetadata
from engine.block_table_rows import BlockTableRows
from engine.cuda_graphs import DecodeGraphs, default_buckets, pick_bucket

log = logging.getLogger(__name__)


# Columns of the packed per-row inputs (one int64 row per sequence: one host-to-device copy).
_IDS, _POS, _SLOT, _LEN = range(4)


class GraphedDecode:
    """``capture()`` once on a CUDA device, then ``run(seqs)`` per pure-decode step.

    Host staging buffers are reused across steps: the runner waits for each step's sampled tokens
    before it prepares the next, so a staged copy has always landed before the buffer is rewritten.
    """

    def __init__(self, model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], *, max_batch: int,
                 max_blocks_per_seq: int, block_size: int, device: torch.device) -> None:
        self._model = model
        self._kv_caches = kv_caches
        self.block_size = block_size
        self._host_rows = torch.zeros(max_batch, 4, dtype=torch.int64, pin_memory=True)
        self._host_tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, pin_memory=True)
        self._rows_np = self._host_rows.numpy()
        self._tables_np = self._host_tables.numpy()
        self._table_rows = BlockTableRows()
        self._host_rows[:, _SLOT] = -1
        static = {
            "rows": self._host_rows.to(device),  # all padding at capture: no KV write, no context
            "block_tables": torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=device),
        }
        # Decode-only steps carry no prefill; these stay empty for every replay.
        self._no_prefill = (torch.zeros(1, dtype=torch.int32, device=device),
                            torch.zeros(0, dtype=torch.int32, device=device),
                            torch.zeros(0, max_blocks_per_seq, dtype=torch.int32, device=device))
        self._graphs = DecodeGraphs(self._step, static, default_buckets(max_batch))

    @property
    def buckets(self) -> list[int]:
        return self._graphs.buckets

    def capture(self) -> None:
        start = time.perf_counter()
        self._graphs.capture()
        log.info("captured decode CUDA graphs for %d batch sizes in %.1f s", len(self.buckets),
                 time.perf_counter() - start)

    def release(self, seq_ids: list[int]) -> None:
        """Forget the cached block-table rows of finished sequences."""
        self._table_rows.release(seq_ids)

    def _step(self, rows: torch.Tensor, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cu_q, prefill_lens, prefill_tables = self._no_prefill
        batch = rows.shape[0]
        cols = rows.t().contiguous()
        meta = AttentionMetadata(slot_mapping=cols[_SLOT], num_decode=batch, decode_seq_lens=cols[_LEN].int(),
                                 decode_block_tables=block_tables, prefill_cu_seqlens_q=cu_q,
                                 prefill_seq_lens=prefill_lens, prefill_block_tables=prefill_tables,
                                 num_tokens=batch)
        hidden = self._model.forward(cols[_IDS], cols[_POS], meta, self._kv_caches)
        logits = self._model.compute_logits(hidden)
        # Computed for every step, sampled or not: the sampler's torch.argmax would cost a launch
        # outside the graph and, on one row of a large vocabulary, far more device time.
        return logits, self._model.ops.greedy_argmax(logits)

    def run(self, seqs: list[Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """float32 logits ``[len(seqs), vocab]`` and their int64 argmax ``[len(seqs)]`` for one decode
        token per sequence, or None when the batch exceeds the largest bucket. Each sequence decodes
        position ``num_computed_tokens``."""
        batch = len(seqs)
        bucket = pick_bucket(self.buckets, batch)
        if bucket is None:
            return None
        pack_decode_inputs(seqs, self._rows_np, self._tables_np, self.block_size, self._table_rows, bucket)
        out = self._graphs.replay(rows=self._host_rows[:bucket], block_tables=self._host_tables[:bucket])
        assert isinstance(out, tuple) and len(out) == 2
        logits, argmax = out  # the bucket's rows: padding rows follow the live ones
        return logits[:batch], argmax[:batch]


def pack_decode_inputs(seqs: list[Any], rows: np.ndarray, tables: np.ndarray, block_size: int,
                       table_rows: BlockTableRows, bucket: int) -> None:
    """Write row i of ``rows`` (token id, position, KV slot, context length) and of ``tables`` (block
    table) for ``seqs[i]`` decoding position ``num_computed_tokens``; rows from ``len(seqs)`` up to
    ``bucket`` become padding: no KV write (slot -1), no context (length 0)."""
    bs = block_size
    width = tables.shape[1]
    for i, seq in enumerate(seqs):
        pos = seq.num_computed_tokens
        table = seq.block_table
        if pos >= len(seq) or len(table) * bs <= pos:
            raise ValueError(f"sequence {seq.request_id!r} cannot decode position {pos}: {len(seq)} tokens, "
                             f"{len(table)} KV blocks")
        rows[i] = (seq.token_ids[pos], pos, table[pos // bs] * bs + pos % bs, pos + 1)
        used = min(len(table), width)
        tables[i, :used] = table_rows.row(seq)[:used]  # columns past the context are never read
    rows[len(seqs):bucket] = (0, 0, -1, 0)
