"""Scoring drafts: one target step's logits at ``[last token, d1, .., dn]`` of each sequence become the tokens
it keeps, with the target's distribution kept exactly (Leviathan et al., 2023).

Each scored row goes through the sampler's transforms as if the drafts before it had been kept: min_tokens,
penalties over the history up to that row, the grammar's mask at that row (the matcher advanced over the
drafts before it, then rolled back), temperature, top-k, top-p, min-p. Greedy rows keep drafts while they
equal the row's argmax, then the argmax itself: token for token what decoding without drafts yields. Sampled
rows accept draft d with probability min(1, p(d) / q(d)) (q a point mass where the proposal gave no
probabilities) and, at the first rejection, draw from max(0, p - q) renormalized; with every draft accepted,
the last row is an ordinary draw. Logprobs are the raw model's, as without speculation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.sampler import (
    RowParams,
    Sampler,
    SampleResult,
    TokenHistory,
    penalize,
    sampling_probs,
)
from omni_gateway.kernels.host_copies import to_device, to_host


@dataclass(frozen=True, slots=True)
class SpecSample:
    """What one sequence keeps from a verify step: its accepted drafts and the target's own token after them
    (truncated later at a stop), and how many drafts it proposed."""

    tokens: tuple[SampleResult, ...]
    num_drafts: int

    @property
    def num_accepted(self) -> int:
        return len(self.tokens) - 1


class _RowView(TokenHistory):
    """A sequence as the sampler sees it at one scored row: its history extended by the drafts before the row.
    The grammar is left out: the verifier fills constrained rows' masks itself."""

    __slots__ = ("seq_id", "eos_token_ids", "grammar", "is_finished")

    def __init__(self, seq: Sequence, drafts: tuple[int, ...]) -> None:
        super().__init__(seq.params, seq.token_ids + list(drafts) if drafts else seq.token_ids, seq.num_prompt_tokens)
        self.seq_id = seq.seq_id
        self.eos_token_ids = seq.eos_token_ids
        self.grammar = None
        self.is_finished = False


def _grammar_masks(logits: torch.Tensor, owners: list[tuple[Sequence, int]], drafts: list[tuple[int, ...]]) -> None:
    """Mask each constrained row in place with its matcher's state after the drafts before the row."""
    import xgrammar as xgr

    rows_of: dict[int, list[int]] = {}
    for r, (seq, _) in enumerate(owners):
        if seq.grammar is not None:
            rows_of.setdefault(seq.seq_id, []).append(r)
    if not rows_of:
        return
    vocab = logits.shape[1]
    bitmask = xgr.allocate_token_bitmask(len(owners), vocab)
    masked: list[int] = []
    for rows in rows_of.values():
        seq, slot = owners[rows[0]]
        matcher, seq_drafts = seq.grammar, drafts[slot]
        advanced = 0
        for j, r in enumerate(rows):
            # Past a draft the grammar refuses, rows repeat the last legal state: the refused draft has
            # probability 0 there, so no later row is ever kept.
            matcher.fill_next_token_bitmask(bitmask, r)
            masked.append(r)
            if j < len(seq_drafts) and advanced == j and not matcher.is_terminated():
                advanced += bool(matcher.accept_token(seq_drafts[j]))
        if advanced:
            matcher.rollback(advanced)
    on_host = logits if logits.device.type == "cpu" else None
    if on_host is not None:
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=masked)
    else:
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=vocab, indices=masked)


def verify(
    sampler: Sampler, logits: torch.Tensor, batch: ScheduledBatch, slots: list[int], probs_of: list[Any]
) -> list[SpecSample | None]:
    """One result per sequence of ``batch``: ``logits`` float32 ``[rows, vocab]`` holds, for each sampling
    sequence (``slots[r]`` its index in ``batch.seqs``), one row per position from its last token to its last
    draft. ``probs_of[i]``: the proposal's draft probabilities of sequence i, or None (point masses)."""
    drafts = batch.drafts or [()] * len(batch.seqs)
    owners: list[tuple[Sequence, int]] = [(batch.seqs[i], i) for i in slots]
    first_row: dict[int, int] = {}
    views = []
    for r, (seq, i) in enumerate(owners):
        j = r - first_row.setdefault(i, r)
        views.append(_RowView(seq, drafts[i][:j]))
    raw = logits
    logits = sampler._mask_min_tokens(logits, views)  # type: ignore[arg-type]
    params = [v.params for v in views]
    penalized, sampled = any(p.penalized for p in params), not all(p.greedy for p in params)
    rows = RowParams.upload(params, logits.shape[1], logits.device)
    if penalized:
        logits = penalize(logits, views, rows)
    if any(seq.grammar is not None for seq, _ in owners):
        logits = logits.clone() if logits is raw else logits
        _grammar_masks(logits, owners, drafts)
    vocab = logits.shape[1]
    greedy_best = logits.argmax(dim=-1)
    draft_col = [
        drafts[i][r - first_row[i]] if r - first_row[i] < len(drafts[i]) else -1 for r, (_, i) in enumerate(owners)
    ]
    if sampled:
        probs = sampling_probs(logits, params, rows)
        noise = sampler._exponential_noise(torch.Size((len(views), vocab + 1)), views)  # type: ignore[arg-type]
        uniform = torch.exp(-noise[:, vocab])
        cols = to_device([max(c, 0) for c in draft_col], torch.int64, logits.device).unsqueeze(1)
        has_draft = to_device([c >= 0 for c in draft_col], torch.bool, logits.device)
        q = torch.zeros_like(probs)
        q.scatter_(1, cols, 1.0)  # point masses; proposals with probabilities overwrite their rows below
        for i, probs_i in enumerate(probs_of):
            if probs_i is not None and i in first_row:
                n = len(drafts[i])
                q[first_row[i] : first_row[i] + n] = torch.as_tensor(probs_i, dtype=q.dtype).to(q.device)
        q = q * has_draft.unsqueeze(1)
        p_d = probs.gather(1, cols).squeeze(1)
        q_d = q.gather(1, cols).squeeze(1)
        accept = uniform * q_d < p_d  # u < p/q without dividing by a zero q
        residual = (probs - q).clamp_min(0.0)
        # Where p <= q everywhere the draft was accepted with certainty; the row's own draw stands in.
        empty = residual.sum(dim=-1, keepdim=True) <= 0
        residual = torch.where(empty, probs, residual)
        drawn = (residual / noise[:, :vocab]).argmax(dim=-1)
        accept_h, drawn_h, best_h = (t.tolist() for t in to_host(accept, drawn, greedy_best))
    else:
        accept_h, drawn_h, best_h = [False] * len(views), [0] * len(views), to_host(greedy_best)[0].tolist()
    kept_rows: list[int] = []
    kept_tokens: list[int] = []
    spans: dict[int, tuple[int, int]] = {}
    for i, r0 in first_row.items():
        seq, n = batch.seqs[i], len(drafts[i])
        start = len(kept_rows)
        for j in range(n + 1):
            r = r0 + j
            d = draft_col[r]
            if seq.params.greedy:
                ok = d >= 0 and best_h[r] == d
                token = d if ok else best_h[r]
            else:
                ok = d >= 0 and bool(accept_h[r])
                token = d if ok else drawn_h[r]
            kept_rows.append(r)
            kept_tokens.append(token)
            if not ok:
                break
        spans[i] = (start, len(kept_rows))
    samples = _with_logprobs(sampler, raw, kept_rows, kept_tokens, [views[r].params for r in kept_rows])
    out: list[SpecSample | None] = [None] * len(batch.seqs)
    for i, (a, b) in spans.items():
        out[i] = SpecSample(tuple(samples[a:b]), len(drafts[i]))
    return out


def _with_logprobs(
    sampler: Sampler, raw: torch.Tensor, rows: list[int], tokens: list[int], params: list[Any]
) -> list[SampleResult]:
    if not any(p.logprobs is not None for p in params):
        return [SampleResult(t, None) for t in tokens]
    index = to_device(rows, torch.int64, raw.device)
    logprobs = torch.log_softmax(raw.index_select(0, index), dim=-1)
    return sampler._with_logprobs(logprobs, to_device(tokens, torch.int64, raw.device), params)
