"""Prefill and mixed steps replayed from CUDA graphs, one per bucket of the step's token count.

An eager prefill step makes a few hundred kernel launches and as many torch calls; beside other work
in the process their launches, not the device, set the step's time (a 528-token talker prefill: 3.8 ms
on the device, 12-20 ms to launch). A step the runner planned (``StepPlan``: decodes first, then
prefill chunks) replays the graph of the smallest token bucket that holds it instead:

- every sequence is a prefill chunk, a decode one of length one, so one varlen attention call covers
  the step; its grid depends only on the bucket's token count and the sequence capacity;
- per-token inputs (id, KV slot, position or M-RoPE positions) are one pinned int64 buffer, staged with
  one copy; padding tokens write no KV (slot -1) and belong to no sequence;
- per-sequence inputs are one int32 buffer of ``max_seqs`` query offsets and context lengths (padding
  sequences have no query and no context) and the block tables of the live sequences;
- embeddings go in a static buffer with their token indices, whatever the model does with them: replace
  the token embeddings (media in a prompt) or add to them (the talker's rows from the thinker). Each graph
  runs one padding token past its bucket, a scratch row that unused index entries point at.

The graph hands back the bucket's hidden states (before the final norm) and token ids, views valid
until the next replay; the runner samples and keeps hidden states from them as it does after an eager
forward. Padding tokens' rows hold values no live row reads. A step no graph holds runs eagerly:
launched ahead (its ids on the device), or more tokens or sequences than the graphs hold.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from omni_gateway.engine.runner.attention import AttentionMetadata
from omni_gateway.engine.runner.cuda_graphs import StagingPair, StepGraphs, pick_bucket
from omni_gateway.engine.runner.step_plan import StepPlan

log = logging.getLogger(__name__)

# Larger steps run eagerly: their device time outweighs their launches (the 7B thinker's 2,048-token
# prefill beside 32 speaking sessions on an H100: 50 ms on the device, 27 ms to launch eagerly).
MAX_GRAPH_TOKENS = 2048

# Columns of the packed per-token inputs; M-RoPE's three position axes take _POS.._POS + 2.
_ID, _SLOT, _POS = 0, 1, 2
_COLS = _POS + 3
_PAD_TOKEN = (0, -1, 0, 0, 0)


def prefill_buckets(max_tokens: int) -> list[int]:
    """Token counts to capture: 16 to 256 by doubling, then every 256, then ``max_tokens`` itself, none
    above ``max_tokens`` (a step pads to at most about twice its tokens, and far less past 512)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens: expected at least 1, got {max_tokens}")
    small = [b for b in (16, 32, 64, 128, 256) if b < max_tokens]
    return sorted(set(small) | set(range(512, max_tokens, 256)) | {max_tokens})


class PrefillStaging:
    """Pinned host buffers of one replay's inputs (used in turn with a twin, ``cuda_graphs.StagingPair``),
    with numpy views of them to pack into."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int) -> None:
        self.rows = torch.zeros(max_tokens, _COLS, dtype=torch.int64, pin_memory=True)
        self.seq_meta = torch.zeros(2 * max_seqs + 1, dtype=torch.int32, pin_memory=True)
        self.tables = torch.zeros(max_seqs * max_blocks_per_seq, dtype=torch.int32, pin_memory=True)
        self.embed_rows = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=True)
        self.arrays = (self.rows.numpy(), self.seq_meta.numpy(), self.tables.numpy(), self.embed_rows.numpy())
        self.copied: torch.cuda.Event | None = None


def pack_prefill_inputs(
    plan: StepPlan,
    rows: np.ndarray,
    seq_meta: np.ndarray,
    tables: np.ndarray,
    embed_rows: np.ndarray,
    bucket: int,
) -> tuple[int, int]:
    """Write ``plan`` as prefill chunks: ``rows[:bucket]`` (id, KV slot, positions; padding tokens from
    ``num_tokens`` on), ``seq_meta`` (``max_seqs + 1`` query offsets, then ``max_seqs`` context lengths;
    padding sequences empty), the leading ``n * width`` entries of the flat ``tables`` as ``[n, width]``
    block tables, and ``embed_rows[:bucket]``: the embeddings' token indices, then the last padding
    token's (``bucket - 1``). Returns ``(n, width)``: the step's sequences and its block tables' width."""
    total, nd = plan.num_tokens, plan.num_decode
    max_seqs = (seq_meta.shape[0] - 1) // 2
    n = nd + len(plan.prefill_lens)
    if n > max_seqs or bucket <= total or bucket > rows.shape[0]:
        raise ValueError(
            f"a step of {n} sequences and {total} tokens does not fit {max_seqs} sequences and {bucket} rows "
            "(one past its tokens)"
        )
    rows[:total, _ID] = plan.ids
    rows[:total, _SLOT] = plan.slots
    if isinstance(plan.positions, torch.Tensor):  # M-RoPE: [3, T]
        rows[:total, _POS:_COLS] = plan.positions.numpy().T
    else:
        rows[:total, _POS] = plan.positions
    rows[total:bucket] = _PAD_TOKEN
    cu, lens = seq_meta[: max_seqs + 1], seq_meta[max_seqs + 1 :]
    cu[: nd + 1] = np.arange(nd + 1)
    cu[nd + 1 : n + 1] = nd + np.asarray(plan.cu_q[1:], dtype=np.int64)
    cu[n + 1 :] = total
    lens[:nd] = plan.decode_lens
    lens[nd:n] = plan.prefill_lens
    lens[n:] = 0
    wd, wp = plan.decode_tables.shape[1], plan.prefill_tables.shape[1]
    width = max(wd, wp)
    view = tables[: n * width].reshape(n, width)
    view[:nd, :wd] = plan.decode_tables
    view[:nd, wd:] = 0
    view[nd:, :wp] = plan.prefill_tables
    view[nd:, wp:] = 0
    k = len(plan.embed_rows)
    embed_rows[:k] = plan.embed_rows
    embed_rows[k:bucket] = bucket - 1
    return n, width


class GraphedPrefill:
    """``capture()`` once on a CUDA device, then ``forward(plan)`` per step that is not a pure decode."""

    def __init__(
        self,
        model: Any,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        split_counters: torch.Tensor | None = None,
    ) -> None:
        self._model = model
        self._kv_caches = kv_caches
        self._mrope = bool(model.uses_mrope)
        self._max_seqs = max_seqs
        self._split_counters = split_counters
        self._token_buckets = prefill_buckets(min(max_tokens, MAX_GRAPH_TOKENS))
        capacity = self._token_buckets[-1] + 1  # the scratch row
        # Rows the model adds to its token embeddings (the talker's) are as wide as its input; embeddings
        # that replace token embeddings as wide as its hidden states.
        width = int(getattr(model, "embedding_size", model.shape.hidden_size))
        self._staging = StagingPair(lambda: PrefillStaging(capacity, max_seqs, max_blocks_per_seq))
        capture_rows = torch.tensor([_PAD_TOKEN], dtype=torch.int64).repeat(capacity, 1)
        static = {
            "rows": capture_rows.to(device),  # all padding at capture: no KV write, no sequence
            "seq_meta": torch.zeros(2 * max_seqs + 1, dtype=torch.int32, device=device),
            "tables": torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, device=device),
            # Capture runs every bucket on a slice of this buffer: index 0 is inside each of them.
            "embed_rows": torch.zeros(capacity, dtype=torch.int64, device=device),
            "embeds": torch.zeros(capacity, width, dtype=model.dtype, device=device),
        }
        self._no_embeds = static["embeds"][:0]
        self._no_decode = (
            torch.zeros(0, dtype=torch.int32, device=device),
            torch.zeros(0, max_blocks_per_seq, dtype=torch.int32, device=device),
        )
        # Every input is staged in full for its bucket, or never read past what is staged: block-table
        # entries past a sequence's context, embedding rows that only the scratch row's index points at.
        self._graphs = StepGraphs(
            self._step,
            static,
            [b + 1 for b in self._token_buckets],
            pad_values={name: None for name in static},
            whole=("seq_meta", "tables"),
        )

    @property
    def buckets(self) -> list[int]:
        """The token counts the graphs hold (each runs one scratch row past its count)."""
        return list(self._token_buckets)

    def capture(self) -> None:
        start = time.perf_counter()
        self._graphs.capture()
        log.info(
            "captured prefill CUDA graphs for %d token counts up to %d in %.1f s",
            len(self.buckets),
            self.buckets[-1],
            time.perf_counter() - start,
        )

    def _step(
        self,
        rows: torch.Tensor,
        seq_meta: torch.Tensor,
        tables: torch.Tensor,
        embed_rows: torch.Tensor,
        embeds: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cols = rows.t().contiguous()
        seqs = self._max_seqs
        meta = AttentionMetadata(
            slot_mapping=cols[_SLOT],
            num_decode=0,
            decode_seq_lens=self._no_decode[0],
            decode_block_tables=self._no_decode[1],
            prefill_cu_seqlens_q=seq_meta[: seqs + 1],
            prefill_seq_lens=seq_meta[seqs + 1 :],
            prefill_block_tables=tables,
            num_tokens=rows.shape[0],
            split_counters=self._split_counters,
        )
        ids = cols[_ID]
        positions = cols[_POS:_COLS] if self._mrope else cols[_POS]
        hidden = self._model.forward(ids, positions, meta, self._kv_caches, embed_rows, embeds)
        return hidden, ids

    def fits(self, plan: StepPlan) -> bool:
        """Whether a graph can run ``plan``: its ids on the host, within the token and sequence capacity, and no
        DeepStack rows (the graphs do not carry them; such a step runs eagerly)."""
        return (
            plan.deepstack is None
            and len(plan.ids) == plan.num_tokens > 0
            and plan.num_tokens <= self._token_buckets[-1]
            and plan.num_decode + len(plan.prefill_lens) <= self._max_seqs
        )

    def forward(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The hidden states ``[num_tokens, hidden]`` and token ids of ``plan``'s tokens, views of the
        graph's outputs valid until the next replay; None where no graph fits (see ``fits``)."""
        if not self.fits(plan):
            return None
        tokens = pick_bucket(self._token_buckets, plan.num_tokens)
        assert tokens is not None
        bucket = tokens + 1  # the graph's rows: the scratch row last
        staging = self._staging.claim()
        n, width = pack_prefill_inputs(plan, *staging.arrays, bucket)
        inputs = {
            "rows": staging.rows[:bucket],
            "seq_meta": staging.seq_meta,
            "tables": staging.tables[: n * width].view(n, width),
            "embed_rows": staging.embed_rows[:bucket],
            "embeds": plan.embeds if plan.embeds is not None else self._no_embeds,
        }
        out = self._graphs.replay(**inputs)
        staging.copied = torch.cuda.Event()
        staging.copied.record()
        assert isinstance(out, tuple)
        hidden, ids = out
        return hidden[: plan.num_tokens], ids[: plan.num_tokens]
