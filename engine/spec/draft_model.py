"""A smaller model sharing the target's tokenizer proposes drafts ("draft_model").

It runs on the engine's own machinery: a second ``ModelRunner`` (its own paged KV cache, and CUDA graphs where
the target has them) and a ``KVCacheManager`` of its own over shadow sequences, one per target sequence. Each
request first rolls a shadow back to the longest common prefix of what it computed and the accepted tokens
(blocks past them return to its pool), computes the new tokens in one step, then decodes one draft per step.

Greedy requests get the draft model's argmax (a point mass for the verifier). Sampled requests get drafts
drawn from the draft model's logits put through the target's own transform (the sampler's penalties over the
request's tokens and the drafts drawn before, then ``sampling_probs``: temperature, top-k, top-p, min-p) over
the target's vocabulary, returned with it (``Proposal.probs``): the verifier accepts each with min(1, p/q),
which keeps far more of them than point masses where the two models agree, and the output stays the target's
exactly. ``min_tokens`` and grammars are the verifier's alone: a draft they forbid is rejected there.
Requests with a ``seed`` keep greedy drafts: drafts drawn from the proposer's own generator would make their
output depend on what else ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq
from typing import Any

import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.sampler import RowParams, TokenHistory, penalize, sampling_probs
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.engine.spec.config import SpeculativeConfig
from omni_gateway.engine.spec.proposer import NO_PROPOSAL, Proposal, ProposalRequest

_GREEDY = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)


def _common_prefix(a: Seq[int], b: Seq[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelProposer:
    name = "draft_model"
    aux_hidden_layers: tuple[int, ...] = ()

    def __init__(self, runner: Any, kv: KVCacheManager, target_vocab: int, seed: int = 0) -> None:
        self.runner = runner  # a ModelRunner (or anything with its step_logits/release and device)
        self.kv = kv
        self.target_vocab = target_vocab
        self._shadows: dict[int, Sequence] = {}
        self._generator = torch.Generator(device=runner.device).manual_seed(seed)

    @classmethod
    def build(cls, spec: SpeculativeConfig, config: EngineConfig, target: Any) -> DraftModelProposer:
        from omni_gateway.engine.runner.loader import load_model
        from omni_gateway.engine.runner.model_runner import ModelRunner

        assert spec.model is not None
        # As many blocks as the target's: the drafts run over the same tokens (a small model's are small).
        draft_config = dataclasses.replace(
            config,
            model=spec.model,
            tokenizer=None,
            speculative_config=None,
            num_kv_blocks=target.num_kv_blocks,
            enable_prefix_caching=False,
        )
        loaded = load_model(draft_config)
        target_vocab = int(target.model.shape.vocab_size)
        runner = ModelRunner(draft_config, loaded)
        assert draft_config.block_size is not None
        kv = KVCacheManager(runner.num_kv_blocks, draft_config.block_size, enable_prefix_caching=False)
        return cls(runner, kv, target_vocab, config.seed)

    @torch.inference_mode()
    def propose(self, requests: Seq[ProposalRequest]) -> list[Proposal]:
        shadows: list[Sequence | None] = [self._catch_up(req) for req in requests]
        drafts: list[list[int]] = [[] for _ in requests]
        qs: list[list[torch.Tensor]] = [[] for _ in requests]
        sampled = [_draws(req.params) for req in requests]
        # First step: every new token of each shadow (one, or a few after accepted drafts, or a whole prompt).
        live = [(i, s) for i, s in enumerate(shadows) if s is not None]
        counts = [s.num_uncomputed_tokens for _, s in live]
        for _ in range(max((r.num_tokens for r in requests), default=0)):
            if not live:
                break
            logits = self.runner.step_logits(ScheduledBatch([s for _, s in live], counts, []))
            # A sampled row's penalties read its prompt, its accepted output and the drafts drawn before it (the
            # shadow's token list, which grows only after the draw).
            histories = [
                TokenHistory(requests[i].params, seq.token_ids, requests[i].num_prompt_tokens) if sampled[i] else None
                for i, seq in live
            ]
            tokens, probs = self._choose(logits, histories)
            nxt = []
            for j, ((i, seq), n, token) in enumerate(zip(live, counts, tokens)):
                seq.num_computed_tokens += n
                if token >= self.target_vocab:
                    continue  # a draft the target cannot score ends this sequence's proposal
                seq.token_ids.append(token)
                drafts[i].append(token)
                if sampled[i]:
                    qs[i].append(probs[j])
                if len(drafts[i]) < requests[i].num_tokens and self.kv.allocate_slots(seq, 1):
                    nxt.append((i, seq))
            live, counts = nxt, [1] * len(nxt)
        return [NO_PROPOSAL if not d else Proposal(tuple(d), torch.stack(q) if q else None) for d, q in zip(drafts, qs)]

    def _choose(self, logits: torch.Tensor, histories: list[TokenHistory | None]) -> tuple[list[int], torch.Tensor]:
        """Each row's draft: its argmax where ``histories`` holds None, else a draw from the distribution the
        target's sampler would make of these logits after that history; and those rows' distributions (float32
        ``[rows, target_vocab]``, zero rows for argmax rows)."""
        rows = [j for j, h in enumerate(histories) if h is not None]
        chosen = logits.argmax(dim=-1)
        probs = logits.new_zeros((logits.shape[0], self.target_vocab), dtype=torch.float32)
        if rows:
            picked = [h for h in histories if h is not None]
            params = [h.params for h in picked]
            width = min(self.target_vocab, logits.shape[1])
            index = torch.tensor(rows, device=logits.device)
            # Over the target's whole vocabulary, tokens the draft model lacks at -inf: the history's tokens
            # index it, and the verifier compares q column for column.
            scores = logits.new_full((len(rows), self.target_vocab), float("-inf"), dtype=torch.float32)
            scores[:, :width] = logits[index, :width].float()
            row_params = RowParams.upload(params, self.target_vocab, logits.device)
            if any(p.penalized for p in params):
                scores = penalize(scores, picked, row_params)
            q = sampling_probs(scores, params, row_params)
            chosen[index] = torch.multinomial(q, 1, generator=self._generator).squeeze(1)
            probs[index] = q
        return chosen.tolist(), probs

    def _catch_up(self, req: ProposalRequest) -> Sequence | None:
        """The shadow of ``req``'s sequence rolled back to what still agrees with its tokens, with slots for
        the tokens it has not computed; None where the draft's pool is short (no proposal this step)."""
        seq = self._shadows.get(req.seq_id)
        tokens = list(req.token_ids)  # the shadow's own copy: it grows by drafts
        if seq is None:
            seq = Sequence(f"draft-{req.seq_id}", tokens, _GREEDY)
            self._shadows[req.seq_id] = seq
        else:
            computed = seq.token_ids[: seq.num_computed_tokens]
            keep = min(_common_prefix(computed, tokens), len(tokens) - 1)
            seq.token_ids[:] = tokens
            seq.num_computed_tokens = keep
            self.kv.trim(seq)
        if not self.kv.allocate_slots(seq, seq.num_uncomputed_tokens):
            return None
        return seq

    def release(self, seq_ids: Seq[int]) -> None:
        gone = [self._shadows.pop(i) for i in seq_ids if i in self._shadows]
        for shadow in gone:
            self.kv.free(shadow)
        if gone:
            self.runner.release([shadow.seq_id for shadow in gone])


def _draws(params: SamplingParams | None) -> bool:
    """Whether a request's drafts are drawn (sampled and unseeded) rather than the argmax."""
    return params is not None and not params.greedy and params.seed is None
