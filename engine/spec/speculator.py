"""The engine's side of speculative decoding (no torch here): which sequences get drafts this step and how many,
their KV slots, and, once the verify step is back, its kept tokens replayed one position at a time through the
engine's ordinary one-token bookkeeping (stops, grammars, prefix-cache hashes), the slots of rejected drafts
returned, and the acceptance measured.

A verify step's results come back before the next step is scheduled (the next drafts start from them), so
pipelined decode (``engine.core.pipelining``) is off while speculation is on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any

from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.spec.policy import SpecPolicy
from omni_gateway.engine.spec.proposer import AuxHidden, ProposalRequest, Proposer, TokenPrefix, check_proposals


def may_speculate(seq: Sequence, num_new_tokens: int) -> bool:
    """Whether ``seq`` may score drafts this step: it decodes its last token, reads nothing but token ids (no
    media, no streamed input rows, no hidden states or pooling asked)."""
    p = seq.params
    return (
        num_new_tokens == 1
        and seq.num_computed_tokens + 1 == len(seq)
        and not seq.embed_spans
        and seq.input_stream is None
        and not p.return_hidden_states
        and p.pooling is None
    )


def room_for_drafts(seq: Sequence, k: int) -> int:
    """At most ``k`` drafts, fewer where max_tokens or the context would end the sequence within the window
    (a step keeps up to drafts + 1 tokens; the last draft's position must fit the context)."""
    room = k
    if seq.params.max_tokens is not None:
        room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
    if seq.max_model_len is not None:
        room = min(room, seq.max_model_len - len(seq))
    return max(room, 0)


# The target's hidden states of a sequence below a position, taken from where the runner keeps them.
AuxSource = Callable[[int, int], AuxHidden | None]


class Speculator:
    """The engine's KV cache manager is passed in at each call: a warm-up replaces it (``engine.runner.warmup``)."""

    def __init__(
        self,
        proposer: Proposer,
        policy: SpecPolicy,
        max_num_batched_tokens: int,
        aux_source: AuxSource | None = None,
    ) -> None:
        """``aux_source(seq_id, upto)``: for a proposer with ``aux_hidden_layers``, the target rows of the
        sequence's accepted positions below ``upto`` not handed out yet."""
        if proposer.aux_hidden_layers and aux_source is None:
            raise ValueError(
                f"proposer {proposer.name!r} reads target layers {proposer.aux_hidden_layers}; "
                "the speculator needs an aux_source"
            )
        self.aux_source = aux_source if proposer.aux_hidden_layers else None
        self.proposer = proposer
        self.policy = policy
        self.max_num_batched_tokens = max_num_batched_tokens
        self.num_drafts = 0  # over the engine's life: drafts scored and accepted
        self.num_accepted = 0
        self.num_verify_steps = 0

    def attach(self, batch: ScheduledBatch, kv: KVCacheManager, num_running: int) -> ScheduledBatch:
        """``batch`` with drafts for the sequences that may take them, their KV slots allocated; ``batch``
        itself where the policy says k=0 or nothing was proposed."""
        k = self.policy.choose_k(num_running)
        if k == 0:
            return batch
        budget = self.max_num_batched_tokens - batch.total_tokens
        wanted: list[tuple[int, int]] = []  # (index in batch, drafts asked)
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            room = min(room_for_drafts(seq, k), budget) if may_speculate(seq, n) else 0
            if room > 0:
                wanted.append((i, room))
                budget -= room
        if not wanted:
            return batch
        requests = [self._request(batch.seqs[i], room) for i, room in wanted]
        proposals = self.proposer.propose(requests)
        check_proposals(requests, proposals)
        drafts: list[tuple[int, ...]] = [()] * len(batch.seqs)
        probs: list[Any] = [None] * len(batch.seqs)
        counts = list(batch.num_new_tokens)
        for (i, _), prop in zip(wanted, proposals):
            seq, guess = batch.seqs[i], prop.token_ids
            # Slots for the drafts' positions; a short pool scores none (the step's own slot is held already).
            if guess and kv.allocate_slots(seq, 1 + len(guess)):
                drafts[i], probs[i], counts[i] = guess, prop.probs, 1 + len(guess)
        if not any(drafts):
            return batch
        return dataclasses.replace(batch, num_new_tokens=counts, drafts=drafts, draft_probs=probs)

    def _request(self, seq: Sequence, room: int) -> ProposalRequest:
        aux = self.aux_source(seq.seq_id, seq.num_computed_tokens) if self.aux_source is not None else None
        return ProposalRequest(seq.seq_id, TokenPrefix(seq.token_ids), room, aux, seq.params, seq.num_prompt_tokens)

    def rounds(self, batch: ScheduledBatch, results: Seq[Any]) -> list[tuple[ScheduledBatch, list[Any]]]:
        """The verify step as consecutive one-token steps: round t keeps the t-th kept token of every sequence
        that has one (a sequence without drafts takes its whole step in round 0)."""
        kept = [list(r.tokens) if hasattr(r, "tokens") else [r] for r in results]
        out = []
        for t in range(max((len(k) for k in kept), default=1)):
            counts, tokens = [], []
            for i, n in enumerate(batch.num_new_tokens):
                has = t < len(kept[i])
                first = n if not (batch.drafts and batch.drafts[i]) else 1
                counts.append((first if t == 0 else 1) if has else 0)
                tokens.append(kept[i][t] if has else None)
            out.append((ScheduledBatch(batch.seqs, counts, batch.preempted if t == 0 else []), tokens))
        return out

    def settle(self, batch: ScheduledBatch, results: Seq[Any], kv: KVCacheManager) -> None:
        """After the rounds: the measured acceptance, and the slots of rejected drafts back in the pool."""
        assert batch.drafts is not None
        proposed = accepted = 0
        for seq, guess, result in zip(batch.seqs, batch.drafts, results):
            if not guess or result is None:
                continue
            proposed += len(guess)
            accepted += result.num_accepted
            if not seq.is_finished:
                kv.trim(seq)
        self.policy.record(proposed, accepted)
        self.num_drafts += proposed
        self.num_accepted += accepted
        self.num_verify_steps += 1

    def release(self, seq_ids: Seq[int]) -> None:
        self.proposer.release(seq_ids)

    def stats(self) -> dict[str, float]:
        """Its counters, as the engine's ``stats()`` reports them."""
        return {
            "spec_draft_tokens": self.num_drafts,
            "spec_accepted_tokens": self.num_accepted,
            "spec_verify_steps": self.num_verify_steps,
            "spec_acceptance_ema": self.policy.acceptance,
        }


def merge_deltas(deltas: list[StreamDelta]) -> list[StreamDelta]:
    """One delta per (request, completion) from the rounds' deltas, in first-seen order: texts, token ids and
    logprobs joined, the last round's finish and counts."""
    merged: dict[tuple[str, int], StreamDelta] = {}
    for d in deltas:
        key = (d.request_id, d.index)
        prev = merged.get(key)
        if prev is None:
            merged[key] = d
            continue
        merged[key] = dataclasses.replace(
            d,
            text=prev.text + d.text,
            token_ids=prev.token_ids + d.token_ids,
            logprobs=prev.logprobs + d.logprobs,
            error=d.error or prev.error,
        )
    return list(merged.values())
