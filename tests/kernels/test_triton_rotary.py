"""Triton apply_rotary and rotary_write_kv against kernels.reference in float64."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.rotary import apply_rotary, rotary_write_kv


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
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    positions = torch.tensor([5, 0, 17, 63], device=device)
    cache = _cos_sin(64, d).float().to(device)
    q_out, k_out = apply_rotary(q, k, positions, cache)
    q_ref, k_ref = ref.apply_rotary(q.double(), k.double(), positions, cache.double())
    assert q_out.is_contiguous() and k_out.is_contiguous()
    assert rel_err(q_out, q_ref) < 1e-5 and rel_err(k_out, k_ref) < 1e-5


def test_position_zero_is_identity(device):
    q = torch.randn(3, 2, 64, device=device)
    k = torch.randn(3, 1, 64, device=device)
    q_out, k_out = apply_rotary(
        q, k, torch.zeros(3, dtype=torch.int64, device=device), _cos_sin(4, 64).float().to(device)
    )
    assert torch.equal(q_out, q) and torch.equal(k_out, k)


def test_rejects_int32_positions(device):
    q = torch.zeros(2, 2, 64, device=device)
    with pytest.raises(ValueError, match="positions: expected dtype"):
        apply_rotary(
            q,
            q[:, :1].contiguous(),
            torch.zeros(2, dtype=torch.int32, device=device),
            _cos_sin(4, 64).float().to(device),
        )


def _fused_qkv(tokens: int, hq: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device, seed: int):
    """q, k, v as column slices of one fused projection output (token stride (hq + 2 hkv) * d)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=gen).to(dtype).to(device)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(tokens, hkv, d)
    return q, k, v


def _kv_caches(hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(hkv * d)
    shape = (3, 8, hkv, d)
    return (
        torch.randn(shape, generator=gen).to(dtype).to(device),
        torch.randn(shape, generator=gen).to(dtype).to(device),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (6, 1, 128)])
def test_rotary_write_kv_matches_reference(device, dtype, hq, hkv, d, rel_err, tolerance):
    tokens = 6
    q, k, v = _fused_qkv(tokens, hq, hkv, d, dtype, device, seed=d + hq)
    assert not k.is_contiguous() and not v.is_contiguous()
    cos_sin = _cos_sin(64, d).to(dtype).to(device)
    positions = torch.tensor([3, 0, 63, 17, 17, 40], device=device)
    slots = torch.tensor([5, -1, 23, 0, -1, 12], device=device)
    k_cache, v_cache = _kv_caches(hkv, d, dtype, device)
    k_before, v_before = k_cache.clone(), v_cache.clone()

    q_out = rotary_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slots)

    k_ref, v_ref = k_before.double(), v_before.double()
    q_ref = ref.rotary_write_kv(q.double(), k.double(), v.double(), positions, cos_sin.double(), k_ref, v_ref, slots)
    assert q_out.shape == q.shape and q_out.dtype == dtype and q_out.is_contiguous()
    assert rel_err(q_out, q_ref) < tolerance[dtype]
    written = slots[slots >= 0]
    untouched = torch.ones(k_cache.shape[0] * k_cache.shape[1], dtype=torch.bool, device=device)
    untouched[written] = False
    k_flat, v_flat = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    assert rel_err(k_flat[written], k_ref.view(-1, hkv, d)[written]) < tolerance[dtype]
    assert torch.equal(v_flat[written], v[slots >= 0])
    # Padding tokens land nowhere: every other slot keeps its old contents.
    assert torch.equal(k_flat[untouched], k_before.view(-1, hkv, d)[untouched])
    assert torch.equal(v_flat[untouched], v_before.view(-1, hkv, d)[untouched])

    # Bitwise the separate launches it replaces: both rotate in fp32 and round once.
    k_sep, v_sep = k_before.clone(), v_before.clone()
    q_sep, k_rot = apply_rotary(q, k, positions, cos_sin)
    ref.write_kv_cache(k_rot, v, k_sep, v_sep, slots)  # a plain scatter: exact in any dtype
    assert torch.equal(q_out, q_sep)
    assert torch.equal(k_cache, k_sep) and torch.equal(v_cache, v_sep)


def test_rotary_write_kv_all_padding_rotates_q_only(device):
    q, k, v = _fused_qkv(3, 2, 1, 32, torch.float32, device, seed=3)
    cos_sin = _cos_sin(8, 32).float().to(device)
    positions = torch.tensor([1, 7, 2], device=device)
    k_cache, v_cache = _kv_caches(1, 32, torch.float32, device)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    q_out = rotary_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, torch.full((3,), -1, device=device))
    assert torch.equal(q_out, apply_rotary(q, k, positions, cos_sin)[0])
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)


def test_rotary_write_kv_no_tokens_is_a_no_op(device):
    q, k, v = _fused_qkv(0, 4, 2, 16, torch.float32, device, seed=0)
    k_cache, v_cache = _kv_caches(2, 16, torch.float32, device)
    k_before = k_cache.clone()
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    q_out = rotary_write_kv(q, k, v, empty, _cos_sin(4, 16).float().to(device), k_cache, v_cache, empty)
    assert q_out.shape == (0, 4, 16) and torch.equal(k_cache, k_before)


def _bad_slot_dtype(args: dict) -> None:
    args["slot_mapping"] = args["slot_mapping"].int()


def _bad_cache_heads(args: dict) -> None:
    args["k_cache"] = torch.zeros(1, 4, 2, 16, device=args["k"].device)
    args["v_cache"] = args["k_cache"].clone()


def _bad_v_shape(args: dict) -> None:
    args["v"] = args["v"][:, :, :8]


def _bad_cache_dtype(args: dict) -> None:
    args["v_cache"] = args["v_cache"].double()


def _bad_v_cache_shape(args: dict) -> None:
    args["v_cache"] = torch.zeros(2, 4, 1, 16, device=args["k"].device)


@pytest.mark.parametrize(
    "corrupt,message",
    [
        (_bad_slot_dtype, "slot_mapping: expected dtype"),
        (_bad_cache_heads, "num_kv_heads"),
        (_bad_v_shape, "v: expected the shape of k"),
        (_bad_cache_dtype, "v_cache: expected dtype"),
        (_bad_v_cache_shape, "v_cache: expected the shape of k_cache"),
    ],
)
def test_rotary_write_kv_rejects(device, corrupt, message):
    args = {
        "q": torch.zeros(2, 2, 16, device=device),
        "k": torch.zeros(2, 1, 16, device=device),
        "v": torch.zeros(2, 1, 16, device=device),
        "positions": torch.zeros(2, dtype=torch.int64, device=device),
        "cos_sin_cache": _cos_sin(4, 16).float().to(device),
        "k_cache": torch.zeros(1, 4, 1, 16, device=device),
        "v_cache": torch.zeros(1, 4, 1, 16, device=device),
        "slot_mapping": torch.zeros(2, dtype=torch.int64, device=device),
    }
    corrupt(args)
    with pytest.raises(ValueError, match=message):
        rotary_write_kv(**args)


def test_rotary_write_kv_rejects_odd_head_dim(device):
    x = torch.zeros(1, 1, 15, device=device)
    cache = torch.zeros(1, 4, 1, 15, device=device)
    with pytest.raises(ValueError, match="even head_dim"):
        rotary_write_kv(
            x,
            x,
            x,
            torch.zeros(1, dtype=torch.int64, device=device),
            torch.zeros(4, 15, device=device),
            cache,
            cache.clone(),
            torch.zeros(1, dtype=torch.int64, device=device),
        )
