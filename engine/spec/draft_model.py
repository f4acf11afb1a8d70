"""A smaller model sharing the target's tokenizer proposes greedy drafts ("draft_model").

It runs on the engine's own machinery: a second ``ModelRunner`` (its own paged KV cache, and CUDA graphs where
the target has them) and a ``KVCacheManager`` of its own over shadow sequences, one per target sequence. Each
request first rolls a shadow back to the longest common prefix of what it computed and the accepted tokens
(blocks past them return to its pool), computes the new tokens in one step, then decodes one draft per step.
Drafts are the draft model's argmax: point masses for the verifier, so any sampling settings stay exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
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

    def __init__(self, runner: Any, kv: KVCacheManager, target_vocab: int) -> None:
        self.runner = runner  # a ModelRunner (or anything with its execute/release)
        self.kv = kv
        self.target_vocab = target_vocab
        self._shadows: dict[int, Sequence] = {}

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
        return cls(runner, kv, target_vocab)

    def propose(self, requests: Seq[ProposalRequest]) -> list[Proposal]:
        shadows: list[Sequence | None] = [self._catch_up(req) for req in requests]
        drafts: list[list[int]] = [[] for _ in requests]
        # First step: every new token of each shadow (one, or a few after accepted drafts, or a whole prompt).
        live = [(i, s) for i, s in enumerate(shadows) if s is not None]
        counts = [s.num_uncomputed_tokens for _, s in live]
        for _ in range(max((r.num_tokens for r in requests), default=0)):
            if not live:
                break
            results = self.runner.execute(ScheduledBatch([s for _, s in live], counts, [])).results()
            nxt = []
            for (i, seq), n, result in zip(live, counts, results):
                seq.num_computed_tokens += n
                token = result.token_id
                if token >= self.target_vocab:
                    continue  # a draft the target cannot score ends this sequence's proposal
                seq.token_ids.append(token)
                drafts[i].append(token)
                if len(drafts[i]) < requests[i].num_tokens and self.kv.allocate_slots(seq, 1):
                    nxt.append((i, seq))
            live, counts = nxt, [1] * len(nxt)
        return [Proposal(tuple(d)) if d else NO_PROPOSAL for d in drafts]

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
