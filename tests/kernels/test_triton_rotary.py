"""Triton apply_rotary against kernels.reference in float64."""
from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.rotary import apply_rotary


def _cos_sin(max_pos: int, d: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, d // 2, dtype=torch.float64) / (d // 2)))
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat([angles.cos(), angles.sin()], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (6, 1, 128)])
def test_rotary_matches_reference(device, dtype, hq, hkv, d, rel_err, tolerance):
    gen = torch.Generator().manual_seed(d + hq)
    tokens = 7
    q = torch.randn(tokens, hq, d, generator=gen).to(dtype).to(device)
    k = torch.randn(tokens, hkv, d, generator=gen).to(dtype).to(device)
    cache = _cos_sin(64, d)
    positions = torch.randint(0, 64, (tokens,), generator=gen).to(device)
    q_out, k_out = apply_rotary(q, k, positions, cache.to(dtype).to(device))
    q_ref, k_ref = ref.apply_rotary(q.double(), k.double(), positions, cache.to(dtype).double().to(device))
    assert q_out.shape == q.shape and k_out.dtype == dtype
    assert rel_err(q_out, q_ref) < tolerance[dtype]
    assert rel_err(k_out, k_ref) < tolerance[dtype]


def test_column_slices_of_a_fused_projection(device, rel_err):
    gen = torch.Generator().manual_seed(9)
    tokens, hq, hkv, d = 4, 4, 2, 64
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=gen).to(device)
    q = qkv[:, :hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(tokens, hkv, d)
    positions = torch.tensor([5, 0, 17, 63], device=device)
    cache = _cos_sin(64, d).float().to(device)
    q_out, k_out = apply_rotary(q, k, positions, cache)
    q_ref, k_ref = ref.apply_rotary(q.double(), k.double(), positions, cache.double())
    assert q_out.is_contiguous() and k_out.is_contiguous()
    assert rel_err(q_out, q_ref) < 1e-5 and rel_err(k_out, k_ref) < 1e-5


def test_position_zero_is_identity(device):
    q = torch.randn(3, 2, 64, device=device)
    k = torch.randn(3, 1, 64, device=device)
    q_out, k_out = apply_rotary(q, k, torch.zeros(3, dtype=torch.int64, device=device), _cos_sin(4, 64).float().to(device))
    assert torch.equal(q_out, q) and torch.equal(k_out, k)


def test_rejects_int32_positions(device):
    q = torch.zeros(2, 2, 64, device=device)
    with pytest.raises(ValueError, match="positions: expected dtype"):
        apply_rotary(q, q[:, :1].contiguous(), torch.zeros(2, dtype=torch.int32, device=device),
                     _cos_sin(4, 64).float().to(device))
