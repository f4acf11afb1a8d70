"""Rejection sampling keeps the target's distribution: many sequences verified in one batch over a 6-token
vocabulary, their kept tokens counted and checked with a chi-square bound (seeded: the same draws each run)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.sampler import RowParams, Sampler, apply_penalties, sampling_probs
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.engine.spec.draft_model import DraftModelProposer
from omni_gateway.engine.spec.proposer import ProposalRequest
from omni_gateway.engine.spec.verify import verify

VOCAB = 6
N = 12000
# Chi-square's 0.999 quantile at 5 degrees of freedom: a correct sampler exceeds it once in a thousand seeds.
CHI2_5_999 = 20.52
ROW0 = torch.tensor([1.0, 0.2, 0.8, -0.5, 0.1, 0.6])
ROW1 = torch.tensor([0.3, 1.2, -0.2, 0.4, 0.9, 0.0])
ROW2 = torch.tensor([0.0, 0.0, 0.5, 0.5, -1.0, 0.2])


def target(
    logits: torch.Tensor, params: SamplingParams, outputs: tuple[int, ...] = (), prompt: tuple[int, ...] = (1, 2, 3)
) -> np.ndarray:
    """The distribution the sampler draws from at a row after ``prompt`` then ``outputs`` (penalties read both)."""
    seq = Sequence("t", list(prompt), params)
    seq.token_ids += outputs
    penalized = apply_penalties(logits.unsqueeze(0), [seq])
    return sampling_probs(penalized, [params], RowParams.upload([params], logits.shape[0], logits.device))[0].numpy()


def chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, f"tokens drawn outside the target's support: {counts}"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum())


def run(params: SamplingParams, drafts: list[tuple[int, ...]], q: Any) -> list[tuple[int, ...]]:
    """``q``: None (point masses), one ``[2, VOCAB]`` array for every sequence, or a list of one per sequence."""
    seqs = [Sequence(f"r{i}", [1, 2, 3], params) for i in range(N)]
    for seq in seqs:
        seq.num_computed_tokens = 2
    batch = ScheduledBatch(seqs, [1 + len(d) for d in drafts], [], drafts=drafts)
    rows = [ROW0, ROW1, ROW2]
    logits = torch.stack([rows[j] for d in drafts for j in range(len(d) + 1)])
    slots = [i for i, d in enumerate(drafts) for _ in range(len(d) + 1)]
    probs = q if isinstance(q, list) else [None if q is None else q[: len(d)] for d in drafts]
    results = verify(Sampler(torch.device("cpu"), seed=1234), logits, batch, slots, probs)
    return [tuple(s.token_id for s in r.tokens) for r in results]


# min-p, and every penalty: the rows after a draft depend on that draft.
PENALIZED = SamplingParams(
    temperature=1.1, min_p=0.15, repetition_penalty=1.3, presence_penalty=0.6, frequency_penalty=0.3
)
SAMPLED = [SamplingParams(temperature=0.9), SamplingParams(temperature=1.3, top_k=4), PENALIZED]


def second_token_check(params: SamplingParams, kept: list[tuple[int, ...]], drafts: list[tuple[int, ...]]) -> float:
    """Chi-square of the second kept token, where the first kept one was the first draft, against the target
    given that draft (a mixture over the drafts where penalties make it depend on them: conservative)."""
    seconds = [(d[0], k[1]) for k, d in zip(kept, drafts) if len(k) > 1 and k[0] == d[0]]
    assert len(seconds) > N // 10
    expected = sum(target(ROW1, params, (first,)) for first, _ in seconds) / len(seconds)
    return chi2(np.bincount([t for _, t in seconds], minlength=VOCAB), expected)


@pytest.mark.parametrize("params", SAMPLED)
@pytest.mark.parametrize("drafting", ["point", "drawn-from-q"])
def test_kept_tokens_follow_the_target_distribution(params: SamplingParams, drafting: str) -> None:
    rng = np.random.default_rng(7)
    q = None
    if drafting == "point":
        drafts = [(2, 4)] * N  # a fixed guess: a point mass the verifier knows nothing else about
    else:
        q = np.array([[0.05, 0.1, 0.5, 0.1, 0.2, 0.05], [0.3, 0.1, 0.1, 0.1, 0.3, 0.1]], dtype=np.float32)
        drafts = [(int(rng.choice(VOCAB, p=q[0])), int(rng.choice(VOCAB, p=q[1]))) for _ in range(N)]
    kept = run(params, drafts, q)
    first = np.bincount([k[0] for k in kept], minlength=VOCAB)
    assert chi2(first, target(ROW0, params)) < CHI2_5_999
    # The second token, where the first kept one was the first draft, follows the target given that draft.
    assert second_token_check(params, kept, drafts) < CHI2_5_999
    # Drafts are kept as a prefix: a kept run never skips a rejected draft.
    assert all(k[:-1] == d[: len(k) - 1] for k, d in zip(kept, drafts))


def test_a_wrong_sampler_fails_the_same_check() -> None:
    params = SamplingParams(temperature=0.9)
    kept = run(params, [(2, 4)] * N, None)
    first = np.bincount([k[0] for k in kept], minlength=VOCAB)
    skewed = target(ROW0, SamplingParams(temperature=0.5))  # another distribution: the bound must notice
    assert chi2(first, skewed) > CHI2_5_999


def test_greedy_keeps_drafts_while_they_are_the_argmax() -> None:
    params = SamplingParams(temperature=0.0)
    kept = run(params, [(0, 1), (0, 4), (2, 1)] + [(0, 1)] * (N - 3), None)
    assert kept[:3] == [(0, 1, 2), (0, 1), (0,)]


# The draft model's logits at the positions of the first and second draft: near the target's, not equal.
DRAFT_ROWS = [
    ROW0 + torch.tensor([0.3, -0.2, 0.0, 0.2, -0.3, 0.1]),
    ROW1 + torch.tensor([-0.2, 0.1, 0.3, 0.0, 0.2, -0.1]),
]


class FixedDraftRunner:
    """A draft model whose next-token logits depend only on how many drafts came before (a shadow of a
    3-token prompt); ``vocab`` columns of them (a draft model's vocabulary may be smaller than the target's)."""

    device = torch.device("cpu")

    def __init__(self, vocab: int = VOCAB) -> None:
        self.vocab = vocab

    def step_logits(self, batch: ScheduledBatch) -> torch.Tensor:
        return torch.stack([DRAFT_ROWS[len(seq.token_ids) - 3][: self.vocab] for seq in batch.seqs])

    def release(self, seq_ids: list[int]) -> None:
        pass


def draft_model_drafts(
    params: SamplingParams,
    tokens: tuple[int, ...] = (1, 2, 3),
    num_prompt_tokens: int = 3,
    n: int = N,
    draft_vocab: int = VOCAB,
) -> tuple[list[tuple[int, ...]], list[Any]]:
    kv = KVCacheManager(n + 1, 16, enable_prefix_caching=False)
    proposer = DraftModelProposer(FixedDraftRunner(draft_vocab), kv, VOCAB)
    requests = [ProposalRequest(i, list(tokens), 2, None, params, num_prompt_tokens) for i in range(n)]
    proposals = proposer.propose(requests)
    return [p.token_ids for p in proposals], [p.probs for p in proposals]


@pytest.mark.parametrize("draft_vocab", [VOCAB, VOCAB - 1])
def test_draft_model_q_is_the_samplers_transform_of_the_draft_logits_after_the_drafts_before(draft_vocab: int) -> None:
    # A 2-token prompt: token 3 is output already, so presence and frequency penalties count it. Token 5 in the
    # prompt is one a smaller draft vocabulary lacks: the repetition penalty still reads it.
    drafts, probs = draft_model_drafts(PENALIZED, (5, 2, 3), num_prompt_tokens=2, n=40, draft_vocab=draft_vocab)
    plain = SamplingParams(temperature=PENALIZED.temperature)
    wide = [torch.cat([row[:draft_vocab], torch.full((VOCAB - draft_vocab,), float("-inf"))]) for row in DRAFT_ROWS]
    for (d0, _), q in zip(drafts, probs):
        torch.testing.assert_close(q[0], torch.as_tensor(target(wide[0], PENALIZED, (3,), prompt=(5, 2))))
        torch.testing.assert_close(q[1], torch.as_tensor(target(wide[1], PENALIZED, (3, d0), prompt=(5, 2))))
        # The penalties and min-p matter here: without them q would differ.
        assert not torch.allclose(q[1], torch.as_tensor(target(wide[1], plain)))
    # A token the draft model lacks is never drawn.
    assert all(float(q[:, draft_vocab:].sum()) == 0.0 for q in probs)
    assert len({d0 for d0, _ in drafts}) > 1


@pytest.mark.parametrize("params", SAMPLED)
def test_draft_model_drafts_are_drawn_from_the_q_they_report_and_keep_the_target(params: SamplingParams) -> None:
    drafts, probs = draft_model_drafts(params)
    assert all(len(d) == 2 and p is not None and p.shape == (2, VOCAB) for d, p in zip(drafts, probs))
    # The drafts follow the reported q (the sampler's transform of the draft model's logits).
    q0 = probs[0][0].numpy()
    torch.testing.assert_close(probs[0][0], torch.as_tensor(target(DRAFT_ROWS[0], params)))
    assert chi2(np.bincount([d[0] for d in drafts], minlength=VOCAB), q0) < CHI2_5_999
    kept = run(params, drafts, probs)
    first = np.bincount([k[0] for k in kept], minlength=VOCAB)
    assert chi2(first, target(ROW0, params)) < CHI2_5_999
    assert second_token_check(params, kept, drafts) < CHI2_5_999
    # Against the draft model's argmax as a point mass, far more of its drafts are kept.
    greedy = draft_model_drafts(dataclasses.replace(params, seed=3))
    assert all(p is None for p in greedy[1]) and len(set(greedy[0])) == 1
    accepted = sum(len(k) - 1 for k in kept)
    assert accepted > 1.5 * sum(len(k) - 1 for k in run(params, greedy[0], None))
