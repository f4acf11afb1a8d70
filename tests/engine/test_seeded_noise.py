"""Counter-based Exp(1) noise of seeded requests: its distribution and its independence from the batch."""

from __future__ import annotations

import math

import torch
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.runner.sampler import Sampler
from omni_gateway.engine.runner.seeded_noise import exponential_rows, row_key
from omni_gateway.engine.sampling_params import SamplingParams


def test_noise_is_exp1_and_columns_and_draws_look_independent() -> None:
    keys = torch.tensor([[row_key(seed, draw)] for seed in range(8) for draw in range(8)])
    noise = exponential_rows(keys, 4096).double()  # 262,144 values
    assert noise.min() > 0 and torch.isfinite(noise).all()
    # Exp(1): mean 1, variance 1, P(E > 1) = 1/e; the standard errors here are about 0.002-0.004.
    assert abs(noise.mean().item() - 1) < 0.01
    assert abs(noise.var().item() - 1) < 0.03
    assert abs((noise > 1).double().mean().item() - math.exp(-1)) < 0.005
    centered = noise - 1
    neighbours = (centered[:, 1:] * centered[:, :-1]).mean().item()
    next_draw = (centered[1:] * centered[:-1]).mean().item()  # draw k and k+1 of one seed, mostly
    assert abs(neighbours) < 0.01 and abs(next_draw) < 0.01


def test_rows_depend_on_their_key_only() -> None:
    keys = torch.tensor([[row_key(7, 0)], [row_key(7, 1)], [row_key(8, 0)], [row_key(2**40 + 7, 0)]])
    rows = exponential_rows(keys, 300)
    assert torch.equal(exponential_rows(keys[2:3], 300)[0], rows[2])  # alone or in a batch alike
    assert len({tuple(r.tolist()) for r in rows}) == 4  # another draw, seed or high word: another row
    assert row_key(7, 0) == row_key(7, 0) and 0 <= row_key(-3, 5) < 2**32


def test_seeded_rows_sample_the_distribution() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1] + [1e-9] * 7]))
    seqs = [Sequence(str(i), [1, 2], SamplingParams(temperature=1.0, seed=1000 + i)) for i in range(3000)]
    tokens = torch.tensor([r.token_id for r in sampler(logits.repeat(len(seqs), 1), seqs)])
    freq = torch.bincount(tokens, minlength=3)[:3].float() / len(seqs)
    assert torch.allclose(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.03)
    # The next step draws afresh for every sequence: about 1 - (0.36 + 0.09 + 0.01) of the tokens change.
    again = torch.tensor([r.token_id for r in sampler(logits.repeat(len(seqs), 1), seqs)])
    assert 0.45 < (again != tokens).float().mean().item() < 0.63


def test_keys_made_on_the_device_equal_the_hosts() -> None:
    """A key taken as the seed of further draws (Qwen3-Omni's code predictor: a frame's codebooks) is mixed on the
    device to the key the host would make."""
    seeds = [0, 7, -3, 2**32 - 1, 2**40 + 7, 2**62, row_key(5, 3)]
    assert row_key(torch.tensor(seeds), 4).tolist() == [row_key(seed, 4) for seed in seeds]
