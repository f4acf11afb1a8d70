"""One step's flattened inputs as host values, decodes first and then prefill chunks: what the eager
forward uploads, what the prefill graphs stage and what every tensor-parallel rank builds its step from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.mrope import mrope_positions

# (sequence, flat start, flat end, first position) of a sequence whose hidden states are copied out.
HiddenSpan = tuple[Sequence, int, int, int]


@dataclass(slots=True)
class StepPlan:
    """``ids`` is empty when the step was launched ahead: its token ids are then on the device (the
    tokens the step in flight samples), ``num_tokens`` of them.
    """

    ids: list[int]
    num_tokens: int
    positions: list[int] | torch.Tensor  # [3, T] for M-RoPE
    slots: list[int]
    num_decode: int
    decode_lens: list[int]
    decode_tables: np.ndarray  # int32 [num_decode, blocks]: arrays pickle as one copy of their bytes
    cu_q: list[int]
    prefill_lens: list[int]
    prefill_tables: np.ndarray
    sample_rows: list[int]  # flat token index of each sampling sequence's last token (and of its drafts)
    embed_rows: list[int]
    embeds: torch.Tensor | None
    # DeepStack rows (EmbedSpan.deepstack) of this step's tokens: flat token indices and ``[layers, rows, hidden]``.
    deepstack_rows: list[int] = dataclasses.field(default_factory=list)
    deepstack: torch.Tensor | None = None


def decode_position(seq: Sequence, block_size: int, ahead: bool) -> int:
    """The position ``seq`` decodes: ``num_computed_tokens``, or with ``ahead`` the one after it, whose
    token is still on the device. Raises ValueError where that position has no token or no KV slot."""
    pos = seq.num_computed_tokens + (1 if ahead else 0)
    # Ahead, the position is the one whose token is in flight; otherwise any not computed yet
    # (a one-token prefill chunk decodes a position before the last).
    if (pos != len(seq) if ahead else pos >= len(seq)) or len(seq.block_table) * block_size <= pos:
        raise ValueError(
            f"sequence {seq.request_id!r} cannot decode position {pos}{' ahead' if ahead else ''}: "
            f"{len(seq)} tokens, {len(seq.block_table)} KV blocks"
        )
    return pos


def build_step_plan(
    batch: ScheduledBatch, ahead: bool, block_size: int, uses_mrope: bool, dtype: torch.dtype
) -> tuple[StepPlan, list[Sequence], list[int], list[HiddenSpan]]:
    """The flattened inputs of ``batch`` (decodes first, then prefill chunks), the decoding
    sequences, the index into ``batch.seqs`` of each sampling row, and the spans of the
    sequences that asked for hidden states. With ``ahead`` (a step launched behind the one in
    flight), every sequence decodes the position after its last known token, whose id is on the
    device. A sequence with drafts (``batch.drafts``) computes its last token and the drafts after it,
    and samples at every one of those positions (one sampling row each)."""
    bs = block_size
    if ahead and any(n != 1 for n in batch.num_new_tokens):
        raise ValueError(f"a step launched ahead decodes one token per sequence, got {batch.num_new_tokens}")
    drafts = batch.drafts or [()] * len(batch.seqs)
    if ahead and any(drafts):
        raise ValueError("a step launched ahead carries no drafts")
    decode = [i for i, n in enumerate(batch.num_new_tokens) if n == 1]
    prefill = [i for i, n in enumerate(batch.num_new_tokens) if n > 1]
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    sample_rows: list[int] = []
    sample_slots: list[int] = []
    embed_rows: list[int] = []
    embed_parts: list[torch.Tensor] = []
    deepstack_rows: list[int] = []
    deepstack_parts: list[torch.Tensor] = []
    mrope_parts: list[torch.Tensor] = []
    hidden_spans: list[HiddenSpan] = []
    cu_q = [0]
    decode_lens: list[int] = []
    prefill_lens: list[int] = []
    num_tokens = 0
    for i in decode + prefill:
        seq = batch.seqs[i]
        start = decode_position(seq, bs, ahead=True) if ahead else seq.num_computed_tokens
        end = start + batch.num_new_tokens[i]
        guesses = drafts[i]
        if guesses and end - len(guesses) != len(seq):
            raise ValueError(
                f"sequence {seq.request_id!r} scores {len(guesses)} drafts from position {start}: it must "
                f"compute its last token then ({len(seq)} tokens), got {batch.num_new_tokens[i]} new tokens"
            )
        if end > len(seq) + ahead + len(guesses):
            raise ValueError(f"sequence {seq.request_id!r} scheduled to compute up to {end} tokens, has {len(seq)}")
        if len(seq.block_table) * bs < end:
            raise ValueError(
                f"sequence {seq.request_id!r} needs {-(-end // bs)} KV blocks for {end} tokens, "
                f"block table has {len(seq.block_table)}"
            )
        flat_start = num_tokens
        num_tokens += end - start
        if seq.params.return_hidden_states:
            hidden_spans.append((seq, flat_start, num_tokens, start))
        if not ahead:  # ahead: the id comes from the device
            ids.extend(seq.token_ids[start : end - len(guesses)])
            ids.extend(guesses)
        slots.extend(seq.slot(pos, bs) for pos in range(start, end))
        if uses_mrope:
            mrope_parts.append(mrope_positions(seq.embed_spans, start, end))
        else:
            positions.extend(range(start, end))
        if end - start == 1:
            decode_lens.append(end)
        else:
            prefill_lens.append(end)
            cu_q.append(cu_q[-1] + end - start)
        if end == len(seq) + ahead + len(guesses) and seq.params.pooling is None:  # pooling samples nothing
            sample_rows.extend(range(num_tokens - 1 - len(guesses), num_tokens))
            sample_slots.extend([i] * (1 + len(guesses)))
        for span in seq.embed_spans:
            lo, hi = max(span.offset, start), min(span.offset + span.length, end)
            if lo < hi:
                embed_rows.extend(range(flat_start + lo - start, flat_start + hi - start))
                embed_parts.append(span.embeds[lo - span.offset : hi - span.offset])
                if span.deepstack is not None:
                    deepstack_rows.extend(range(flat_start + lo - start, flat_start + hi - start))
                    deepstack_parts.append(span.deepstack[:, lo - span.offset : hi - span.offset])
        stream = seq.input_stream
        if stream is not None and end > stream.start:
            lo = max(start, stream.start)
            embed_rows.extend(range(flat_start + lo - start, flat_start + end - start))
            embed_parts.append(torch.stack([torch.as_tensor(row) for row in stream.rows(lo, end)]))
    decode_seqs = [batch.seqs[i] for i in decode]
    prefill_seqs = [batch.seqs[i] for i in prefill]
    plan = StepPlan(
        ids=ids,
        num_tokens=num_tokens,
        positions=torch.cat(mrope_parts, dim=1) if uses_mrope else positions,
        slots=slots,
        num_decode=len(decode),
        decode_lens=decode_lens,
        decode_tables=_table_rows(decode_seqs, decode_lens, bs),
        cu_q=cu_q,
        prefill_lens=prefill_lens,
        prefill_tables=_table_rows(prefill_seqs, prefill_lens, bs),
        sample_rows=sample_rows,
        embed_rows=embed_rows,
        embeds=torch.cat([p.to(dtype) for p in embed_parts], dim=0) if embed_parts else None,
        deepstack_rows=deepstack_rows,
        deepstack=_deepstack(deepstack_parts, dtype),
    )
    return plan, decode_seqs, sample_slots, hidden_spans


def _deepstack(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor | None:
    """``[layers, rows, hidden]`` of the step's DeepStack rows; spans of fewer layers are zero-padded to the most."""
    if not parts:
        return None
    layers = max(p.shape[0] for p in parts)
    padded = [torch.cat((p, p.new_zeros(layers - p.shape[0], *p.shape[1:]))) for p in parts]
    return torch.cat([p.to(dtype) for p in padded], dim=1)


def _table_rows(seqs: list[Sequence], lengths: list[int], block_size: int) -> np.ndarray:
    """int32 ``[len(seqs), max blocks in use]``: each sequence's block table cut or zero-padded to
    the blocks covering the longest context."""
    width = max((-(-n // block_size) for n in lengths), default=0)
    rows = np.zeros((len(seqs), width), dtype=np.int32)
    for i, seq in enumerate(seqs):
        used = min(width, len(seq.block_table))
        rows[i, :used] = seq.block_table[:used]
    return rows
