"""Triton silu_and_mul against kernels.reference in float64."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.activation import silu_and_mul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter", [48, 1500])
def test_silu_and_mul_matches_reference(device, dtype, inter, rel_err, tolerance):
    gen = torch.Generator().manual_seed(inter)
    x = (4 * torch.randn(3, 2 * inter, generator=gen)).to(dtype).to(device)
    out = silu_and_mul(x)
    assert out.shape == (3, inter) and out.dtype == dtype
    assert rel_err(out, ref.silu_and_mul(x.double())) < tolerance[dtype]


def test_rejects_odd_width(device):
    with pytest.raises(ValueError, match="even last dimension"):
        silu_and_mul(torch.zeros(2, 7, device=device))
