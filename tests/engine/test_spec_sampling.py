"""Rejection sampling keeps the target's distribution: many sequences verified in one batch over a 6-token
vocabulary, their kept tokens counted and checked with a chi-square bound (seeded: the same draws each run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.sampler import Sampler, apply_top_k_top_p
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.engine.spec.verify import verify

VOCAB = 6
N = 12000
# Chi-square's 0.999 quantile at 5 degrees of freedom: a correct sampler exceeds it once in a thousand seeds.
CHI2_5_999 = 20.52
ROW0 = torch.tensor([1.0, 0.2, 0.8, -0.5, 0.1, 0.6])
ROW1 = torch.tensor([0.3, 1.2, -0.2, 0.4, 0.9, 0.0])
ROW2 = torch.tensor([0.0, 0.0, 0.5, 0.5, -1.0, 0.2])


def target(logits: torch.Tensor, params: SamplingParams) -> np.ndarray:
    scaled = (logits / params.temperature).unsqueeze(0)
    scaled = apply_top_k_top_p(scaled, [params.top_k], [params.top_p])
    return torch.softmax(scaled, dim=-1)[0].numpy()


def chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, f"tokens drawn outside the target's support: {counts}"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum())


def run(params: SamplingParams, drafts: list[tuple[int, ...]], q: np.ndarray | None) -> list[tuple[int, ...]]:
    seqs = [Sequence(f"r{i}", [1, 2, 3], params) for i in range(N)]
    for seq in seqs:
        seq.num_computed_tokens = 2
    batch = ScheduledBatch(seqs, [1 + len(d) for d in drafts], [], drafts=drafts)
    rows = [ROW0, ROW1, ROW2]
    logits = torch.stack([rows[j] for d in drafts for j in range(len(d) + 1)])
    slots = [i for i, d in enumerate(drafts) for _ in range(len(d) + 1)]
    probs = [None if q is None else q[: len(d)] for d in drafts]
    results = verify(Sampler(torch.device("cpu"), seed=1234), logits, batch, slots, probs)
    return [tuple(s.token_id for s in r.tokens) for r in results]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.9), SamplingParams(temperature=1.3, top_k=4)])
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
    seconds = [k[1] for k, d in zip(kept, drafts) if len(k) > 1 and k[0] == d[0]]
    assert len(seconds) > N // 10
    second = np.bincount(seconds, minlength=VOCAB)
    assert chi2(second, target(ROW1, params)) < CHI2_5_999
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
