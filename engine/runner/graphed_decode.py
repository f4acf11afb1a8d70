"""Pure-decode steps of a text model replayed from CUDA graphs, one per batch-size bucket.

The runner hands over a step's sequences; their token ids, positions, KV slots and context
lengths are packed into one pinned host buffer and their block tables into another, both staged
into the graphs' static buffers with one asynchronous copy each. The smallest fitting graph
replays the whole model forward, the LM head and a greedy argmax, and the logits and argmax of
the live rows come back as views of the graph's outputs (valid until the next replay).

A step launched ahead of the host (``forward`` with ``after``) does not know its token ids: its
rows carry id -1 and the graph takes those rows' ids from a device buffer, staged from the
argmax of the step in flight by a device-to-device copy.

A model that adds input rows to its token embeddings (``adds_input_rows``: Qwen2.5-Omni's talker, whose
rows come from the thinker) gets a third static buffer, one row per sequence, zero where a sequence has
no row. The graph also hands back each row's final hidden state (before the last norm) and token id, so
a sequence that asked for hidden states needs no eager step. A sequence past media spans with M-RoPE
positions decodes at its index plus the spans' shift, where all three axes agree (plain rotary).

Padding rows get KV slot -1 (the cache write skips it) and context length 0 (decode attention
answers zeros), so they neither read nor write live KV blocks. The block-table buffer is as wide
as the longest context the engine admits; entries past a sequence's context are never read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.runner.attention import AttentionMetadata
from omni_gateway.engine.runner.block_table_rows import BlockTableRows
from omni_gateway.engine.runner.cuda_graphs import StagingPair, StepGraphs, default_buckets, pick_bucket
from omni_gateway.engine.runner.mrope import text_shift
from omni_gateway.engine.runner.pending_decode import PendingDecode
from omni_gateway.engine.runner.step_plan import decode_position

log = logging.getLogger(__name__)


# Columns of the packed per-row inputs (one int64 row per sequence: one host-to-device copy).
_IDS, _POS, _SLOT, _LEN = range(4)
_FROM_DEVICE = -1  # token id column: take the id from the device buffer ``prev_ids``


class Staging:
    """Pinned host buffers of one step (used in turn with a twin, ``cuda_graphs.StagingPair``)."""

    def __init__(self, max_batch: int, max_blocks_per_seq: int) -> None:
        self.rows = torch.zeros(max_batch, 4, dtype=torch.int64, pin_memory=True)
        self.tables = torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, pin_memory=True)
        self.tokens = torch.zeros(max_batch, dtype=torch.int64, pin_memory=True)
        self.rows_np = self.rows.numpy()
        self.tables_np = self.tables.numpy()
        self.copied: torch.cuda.Event | None = None


class GraphedDecode:
    """``capture()`` once on a CUDA device, then ``forward(seqs, after)`` per pure-decode step."""

    def __init__(
        self,
        model: Any,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        max_batch: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
        input_rows: bool = False,
        split_counters: torch.Tensor | None = None,
    ) -> None:
        self._model = model
        self._split_counters = split_counters  # the engine's own (AttentionMetadata.split_counters)
        # Rows added to the token embeddings (``adds_input_rows`` models): one per sequence, staged per step.
        self.input_rows = input_rows
        self._kv_caches = kv_caches
        self.block_size = block_size
        self._staging = StagingPair(lambda: Staging(max_batch, max_blocks_per_seq))
        self._table_rows = BlockTableRows()
        capture_rows = torch.zeros(max_batch, 4, dtype=torch.int64)
        capture_rows[:, _SLOT] = -1
        static = {
            "rows": capture_rows.to(device),  # all padding at capture: no KV write, no context
            "block_tables": torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=device),
            "prev_ids": torch.zeros(max_batch, dtype=torch.int64, device=device),
        }
        if input_rows:
            static["embeds"] = torch.zeros(max_batch, model.embedding_size, dtype=model.dtype, device=device)
            self._zero_row = torch.zeros(model.embedding_size, dtype=torch.float32, device=device)
        # Decode-only steps carry no prefill; these stay empty for every replay.
        self._no_prefill = (
            torch.zeros(1, dtype=torch.int32, device=device),
            torch.zeros(0, dtype=torch.int32, device=device),
            torch.zeros(0, max_blocks_per_seq, dtype=torch.int32, device=device),
        )
        # prev_ids is read only where a row's id is _FROM_DEVICE: padding rows past a batch are never read.
        self._graphs = StepGraphs(self._step, static, default_buckets(max_batch), pad_values={"prev_ids": None})
        # Tensor parallel: rank 0 hands each replay's inputs to the other ranks, which ``replay`` them.
        self.on_replay: Callable[[dict[str, torch.Tensor]], None] | None = None

    @property
    def buckets(self) -> list[int]:
        return self._graphs.buckets

    def capture(self) -> None:
        start = time.perf_counter()
        self._graphs.capture()
        log.info(
            "captured decode CUDA graphs for %d batch sizes in %.1f s", len(self.buckets), time.perf_counter() - start
        )

    def release(self, seq_ids: list[int]) -> None:
        """Forget the cached block-table rows of finished sequences."""
        self._table_rows.release(seq_ids)

    def _step(
        self,
        rows: torch.Tensor,
        block_tables: torch.Tensor,
        prev_ids: torch.Tensor,
        embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        cu_q, prefill_lens, prefill_tables = self._no_prefill
        batch = rows.shape[0]
        cols = rows.t().contiguous()
        ids = torch.where(cols[_IDS] == _FROM_DEVICE, prev_ids, cols[_IDS])
        meta = AttentionMetadata(
            slot_mapping=cols[_SLOT],
            num_decode=batch,
            decode_seq_lens=cols[_LEN].int(),
            decode_block_tables=block_tables,
            prefill_cu_seqlens_q=cu_q,
            prefill_seq_lens=prefill_lens,
            prefill_block_tables=prefill_tables,
            num_tokens=batch,
            split_counters=self._split_counters,
        )
        if embeds is not None:  # zero rows (padding, no stream) add nothing
            every = torch.arange(batch, device=ids.device)
            hidden = self._model.forward(ids, cols[_POS], meta, self._kv_caches, every, embeds)
        else:
            hidden = self._model.forward(ids, cols[_POS], meta, self._kv_caches)
        logits = self._model.compute_logits(hidden)
        # Computed for every step, sampled or not: the sampler's torch.argmax would cost a launch
        # outside the graph and, on one row of a large vocabulary, far more device time.
        return logits, self._model.ops.greedy_argmax(logits), hidden, ids

    def forward(self, seqs: list[Sequence], after: PendingDecode | None = None) -> GraphedStep | None:
        """float32 logits ``[len(seqs), vocab]`` and their int64 argmax ``[len(seqs)]`` for one decode
        token per sequence, their hidden states and token ids (views of the graph's outputs, valid until
        the next replay), and the step's staging buffers, whose ``copied`` the caller sets once their
        last use is queued; None when the batch exceeds the largest bucket. Each sequence decodes
        position ``num_computed_tokens``, or with ``after``, the step in flight whose tokens the host
        has not read, the position after it, with the token ``after`` samples for it."""
        bucket = pick_bucket(self.buckets, len(seqs))
        if bucket is None:
            return None
        staging = self._staging.claim()
        pack_decode_inputs(
            seqs,
            staging.rows_np,
            staging.tables_np,
            self.block_size,
            self._table_rows,
            bucket,
            ahead=after is not None,
        )
        inputs = {"rows": staging.rows[:bucket], "block_tables": staging.tables[:bucket]}
        if after is not None:
            inputs["prev_ids"] = after.tokens_for(seqs)
        if self.input_rows:
            inputs["embeds"] = self._input_rows(seqs, after is not None)
        if self.on_replay is not None:
            self.on_replay(inputs)
        out = self.replay(inputs)  # the bucket's rows: padding rows follow the live ones
        n = len(seqs)
        return GraphedStep(out[0][:n], out[1][:n], staging, out[2][:n], out[3][:n])

    def _input_rows(self, seqs: list[Sequence], ahead: bool) -> torch.Tensor:
        """``[len(seqs), embedding_size]``: each sequence's input row of the position it decodes (zeros without)."""
        zero = self._zero_row
        rows = []
        for seq in seqs:
            stream, pos = seq.input_stream, decode_position(seq, self.block_size, ahead)
            row = zero if stream is None or pos < stream.start else torch.as_tensor(stream.rows(pos, pos + 1)[0])
            # The thinker's rows are float32 on this device already: a call that changes nothing would still
            # give up the interpreter lock and wait to take it back, once per sequence.
            if row.device != zero.device or row.dtype != zero.dtype:
                row = row.to(device=zero.device, dtype=zero.dtype)
            rows.append(row)
        return torch.stack(rows)

    def replay(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Replay the graph of a bucket's staged ``rows``, ``block_tables`` (``prev_ids``, ``embeds``):
        its logits, argmax, hidden states and token ids."""
        out = self._graphs.replay(**inputs)
        assert isinstance(out, tuple) and len(out) == 4
        return out


@dataclass(frozen=True, slots=True)
class GraphedStep:
    logits: torch.Tensor
    argmax: torch.Tensor
    staging: Staging
    hidden: torch.Tensor  # before the final norm
    ids: torch.Tensor


def pack_decode_inputs(
    seqs: list[Sequence],
    rows: np.ndarray,
    tables: np.ndarray,
    block_size: int,
    table_rows: BlockTableRows,
    bucket: int,
    *,
    ahead: bool = False,
) -> None:
    """Write row i of ``rows`` (token id, position, KV slot, context length) and of ``tables`` (block
    table) for ``seqs[i]`` decoding position ``num_computed_tokens``, or with ``ahead`` the position
    after it, whose token is still on the device (id ``-1``); rows from ``len(seqs)`` up to
    ``bucket`` become padding: no KV write (slot -1), no context (length 0)."""
    bs = block_size
    width = tables.shape[1]
    for i, seq in enumerate(seqs):
        pos = decode_position(seq, bs, ahead)
        table = seq.block_table
        token = _FROM_DEVICE if ahead else seq.token_ids[pos]
        rows[i] = (token, pos + text_shift(seq.embed_spans), seq.slot(pos, bs), pos + 1)
        used = min(len(table), width)
        tables[i, :used] = table_rows.row(seq)[:used]  # columns past the context are never read
    rows[len(seqs) : bucket] = (0, 0, -1, 0)
