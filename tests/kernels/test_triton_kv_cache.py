"""Triton write_kv_cache against kernels.reference: exact scatter, padding slots skipped."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.kv_cache import write_kv_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scatter_matches_reference_and_skips_padding(device, dtype):
    gen = torch.Generator().manual_seed(1)
    tokens, hkv, d = 9, 2, 64
    k = torch.randn(tokens, hkv, d, generator=gen).to(dtype).to(device)
    v = torch.randn(tokens, hkv, d, generator=gen).to(dtype).to(device)
    k_cache = torch.randn(6, 16, hkv, d, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(6, 16, hkv, d, generator=gen).to(dtype).to(device)
    slots = torch.randperm(6 * 16, generator=gen)[:tokens]
    slots[[2, 5]] = -1
    slots = slots.to(device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_cache(k, v, k_cache, v_cache, slots)
    ref.write_kv_cache(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    # The padding tokens' values were written nowhere.
    flat = k_cache.view(-1, hkv, d)
    for t in (2, 5):
        assert not (flat == k[t]).all(-1).all(-1).any()


def test_accepts_column_slices_of_a_fused_projection(device):
    gen = torch.Generator().manual_seed(4)
    tokens, hkv, d = 5, 2, 32
    qkv = torch.randn(tokens, (4 + 2 * hkv) * d, generator=gen).to(device)
    k = qkv[:, 4 * d : (4 + hkv) * d].view(tokens, hkv, d)
    v = qkv[:, (4 + hkv) * d :].view(tokens, hkv, d)
    assert not k.is_contiguous()
    k_cache = torch.zeros(2, 16, hkv, d, device=device)
    v_cache = torch.zeros_like(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([0, 31, 7, -1, 16], device=device)
    write_kv_cache(k, v, k_cache, v_cache, slots)
    ref.write_kv_cache(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_rejects_strided_heads(device):
    k = torch.zeros(2, 2, 32, device=device)[:, :, ::2]
    cache = torch.zeros(1, 16, 2, 16, device=device)
    with pytest.raises(ValueError, match="contiguous"):
        write_kv_cache(k, k, cache, cache.clone(), torch.zeros(2, dtype=torch.int64, device=device))


def test_rejects_wrong_slot_dtype(device):
    k = torch.zeros(2, 1, 16, device=device)
    cache = torch.zeros(1, 16, 1, 16, device=device)
    with pytest.raises(ValueError, match="slot_mapping: expected dtype"):
        write_kv_cache(k, k, cache, cache.clone(), torch.zeros(2, dtype=torch.int32, device=device))


def test_rejects_head_mismatch(device):
    k = torch.zeros(2, 2, 16, device=device)
    cache = torch.zeros(1, 16, 1, 16, device=device)
    with pytest.raises(ValueError, match="num_kv_heads"):
        write_kv_cache(k, k, cache, cache.clone(), torch.zeros(2, dtype=torch.int64, device=device))
