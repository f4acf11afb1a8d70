"""The target's hidden states of chosen layers, kept per sequence until a speculative proposer takes them.

Each forward leaves ``[T, len(layers), hidden]`` rows (``LlamaModel.aux_hidden``); ``record`` files every
sequence's slice under the positions it computed. A computation at position ``p`` supersedes whatever was kept
at ``p`` and after (rejected drafts, a preempted sequence computing its prompt again), so what is kept is
always what the target last computed there. ``take`` hands out the rows below a sequence's computed length
(the accepted positions) and forgets them.

Rows pile up while a sequence gets no proposal request (steps where the policy picks k=0, a long prompt), so
each sequence keeps only its most recent ones: once it holds more than ``2 * max_rows``, everything but the
last ``max_rows`` is dropped (amortized: one copy per ``max_rows`` rows). The proposer then receives rows that
start past where it stopped and re-syncs over that recent window (``engine.spec.eagle3``); drafts are only
guesses, so the output stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch
from omni_gateway.engine.core.sequence import ScheduledBatch
from omni_gateway.engine.spec.proposer import AuxHidden

# Rows of a sequence kept for the proposer (between this and twice this): 3 layers x hidden each, so
# 512 rows of a 4096-wide target are 12 MiB in bf16 at most twice over, whatever the context.
DEFAULT_MAX_ROWS = 512


class AuxHiddenStore:
    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self._rows: dict[int, list[tuple[int, torch.Tensor]]] = {}  # seq_id -> (first position, rows) in order

    def record(self, batch: ScheduledBatch, rows: torch.Tensor) -> None:
        """File ``rows`` (one per flat token of ``batch``'s step, laid out as ``build_step_plan`` lays the
        tokens: decoding sequences first, then prefill chunks) under each sequence's positions."""
        order = [i for i, n in enumerate(batch.num_new_tokens) if n == 1]
        order += [i for i, n in enumerate(batch.num_new_tokens) if n > 1]
        flat = 0
        for i in order:
            seq, n = batch.seqs[i], batch.num_new_tokens[i]
            first = seq.num_computed_tokens
            kept = [(p, r) for p, r in self._rows.get(seq.seq_id, []) if p < first]
            if kept and kept[-1][0] + len(kept[-1][1]) > first:
                p, r = kept[-1]
                kept[-1] = (p, r[: first - p])
            if kept and kept[-1][0] + len(kept[-1][1]) < first:
                kept = []  # admitted past a gap (blocks another sequence computed): the rows must run unbroken
            skip = max(0, n - self.max_rows)  # a chunk longer than the window keeps its tail only
            if skip:
                kept = []
            # A copy: the slice would keep the whole step's rows alive until taken.
            kept.append((first + skip, rows[flat + skip : flat + n].clone()))
            self._rows[seq.seq_id] = self._bounded(kept)
            flat += n
        if flat != rows.shape[0]:
            raise ValueError(f"a step of {flat} tokens left {rows.shape[0]} hidden-state rows")

    def _bounded(self, chunks: list[tuple[int, torch.Tensor]]) -> list[tuple[int, torch.Tensor]]:
        """``chunks`` as they are while they hold at most ``2 * max_rows`` rows, else their last ``max_rows``
        rows in one fresh tensor (a copy, so the dropped rows' storage goes)."""
        end = chunks[-1][0] + len(chunks[-1][1])
        if end - chunks[0][0] <= 2 * self.max_rows:
            return chunks
        start = end - self.max_rows
        pieces = [r[max(0, start - p) :] for p, r in chunks if p + len(r) > start]
        return [(start, torch.cat(pieces) if len(pieces) > 1 else pieces[0].clone())]

    def num_rows(self, seq_id: int) -> int:
        """How many rows are kept for ``seq_id``."""
        return sum(len(r) for _, r in self._rows.get(seq_id, []))

    def take(self, seq_id: int, upto: int) -> AuxHidden | None:
        """The kept rows of ``seq_id`` at positions below ``upto`` (from its first kept position on, which
        must run unbroken), forgotten here; rows at ``upto`` and after are dropped too (never accepted)."""
        chunks = self._rows.pop(seq_id, [])
        pieces = [r[: max(0, upto - p)] for p, r in chunks if p < upto]
        if not pieces:
            return None
        first = chunks[0][0]
        return AuxHidden(first, pieces[0] if len(pieces) == 1 else torch.cat(pieces))

    def release(self, seq_ids: Seq[int]) -> None:
        for seq_id in seq_ids:
            self._rows.pop(seq_id, None)
