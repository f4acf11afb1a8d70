"""Triton greedy_argmax against torch.argmax: chunk winners, ties and padding columns."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.argmax import greedy_argmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [7, 1000, 5000, 300_001])
def test_matches_torch_argmax(device, dtype, vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=gen).to(dtype)
    # Put each row's winner somewhere else: first column, last column (a padded chunk), middle.
    for row, col in enumerate((0, vocab - 1, vocab // 2)):
        logits[row, col] = 50.0
    logits = logits.to(device)
    out = greedy_argmax(logits)
    assert out.dtype == torch.int64 and out.shape == (3,)
    assert out.cpu().tolist() == ref.greedy_argmax(logits).cpu().tolist() == [0, vocab - 1, vocab // 2]


def test_ties_pick_the_lowest_column_across_chunks(device):
    logits = torch.full((2, 5000), -3.0)
    logits[0, [4097, 1100, 4999]] = 2.0  # equal maxima in three different chunks
    logits[1, [3, 2]] = 2.0  # equal maxima inside one chunk
    out = greedy_argmax(logits.to(device)).cpu().tolist()
    assert out == [1100, 2]


def test_all_minus_inf_row_picks_column_zero(device):
    logits = torch.full((1, 3000), float("-inf"))
    assert greedy_argmax(logits.to(device)).cpu().tolist() == [0]


def test_empty_batch_and_bad_input(device):
    assert greedy_argmax(torch.zeros(0, 10, device=device)).shape == (0,)
    with pytest.raises(ValueError, match="at least one column"):
        greedy_argmax(torch.zeros(2, 0, device=device))
    with pytest.raises(ValueError, match="2 dimensions"):
        greedy_argmax(torch.zeros(10, device=device))
    with pytest.raises(ValueError, match="dtype"):
        greedy_argmax(torch.zeros(1, 10, dtype=torch.int64, device=device))
