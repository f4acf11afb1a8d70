"""The target's hidden states of chosen layers, kept per sequence until a speculative proposer takes them.

Each forward leaves ``[T, len(layers), hidden]`` rows (``LlamaModel.aux_hidden``); ``record`` files every
sequence's slice under the positions it computed. A computation at position ``p`` supersedes whatever was kept
at ``p`` and after (rejected drafts, a preempted sequence computing its prompt again), so what is kept is
always what the target last computed there. ``take`` hands out the rows below a sequence's computed length
(the accepted positions) and forgets them.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch
from omni_gateway.engine.core.sequence import ScheduledBatch
from omni_gateway.engine.spec.proposer import AuxHidden


class AuxHiddenStore:
    def __init__(self) -> None:
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
            # A copy: the slice would keep the whole step's rows alive until taken.
            kept.append((first, rows[flat : flat + n].clone()))
            self._rows[seq.seq_id] = kept
            flat += n
        if flat != rows.shape[0]:
            raise ValueError(f"a step of {flat} tokens left {rows.shape[0]} hidden-state rows")

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
