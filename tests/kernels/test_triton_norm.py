"""Triton rms_norm and fused_add_rms_norm against kernels.reference in float64."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.norm import fused_add_rms_norm, rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 96])
def test_rms_norm_matches_reference(device, dtype, hidden, rel_err, tolerance):
    gen = torch.Generator().manual_seed(hidden)
    x = (3 * torch.randn(5, hidden, generator=gen)).to(dtype).to(device)
    w = torch.randn(hidden, generator=gen).to(dtype).to(device)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == dtype
    assert rel_err(out, ref.rms_norm(x.double(), w.double(), 1e-6)) < tolerance[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_matches_reference(device, dtype, rel_err, tolerance):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 80, generator=gen).to(dtype).to(device)
    residual = torch.randn(4, 80, generator=gen).to(dtype).to(device)
    w = torch.randn(80, generator=gen).to(dtype).to(device)
    normed, new_residual = fused_add_rms_norm(x, residual, w, 1e-5)
    ref_normed, ref_residual = ref.fused_add_rms_norm(x, residual, w, 1e-5)
    # The sum is rounded to the activation dtype; the CPU interpreter truncates instead of rounding
    # to nearest, so allow one unit in the last place there.
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(new_residual, ref_residual, rtol=ulp, atol=0)
    expected = ref.rms_norm(ref_residual.double(), w.double(), 1e-5)
    assert rel_err(normed, expected) < tolerance[dtype]


def test_rejects_weight_of_wrong_size(device):
    with pytest.raises(ValueError, match="hidden size"):
        rms_norm(torch.zeros(2, 32, device=device), torch.ones(16, device=device), 1e-6)
