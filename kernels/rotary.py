"""Triton NeoX-style rotary embedding (same signatures as ``kernels.reference``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import (
    FLOAT_DTYPES,
    KV_CACHE_DTYPES,
    check_cache_dtype,
    check_dim,
    check_same_dtype,
    check_tensor,
    check_token_rows,
    next_pow2,
)


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    src_row,
    dst_row,
    cos,
    sin,
    halves,
    half_ok,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # src_row/dst_row are element offsets of one token's [NUM_HEADS, HEAD_DIM] row, so the
    # destination can be a dense output row or a paged-cache slot alike.
    heads = tl.arange(0, BLOCK_H)
    ok = (heads < NUM_HEADS)[:, None] & half_ok[None, :]
    cols = heads[:, None] * HEAD_DIM + halves[None, :]
    src = src_row + cols
    dst = dst_row + cols
    x1 = tl.load(x_ptr + src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + src + HEAD_DIM // 2, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + dst, _narrow(x1 * cos - x2 * sin, out_ptr), mask=ok)
    tl.store(out_ptr + dst + HEAD_DIM // 2, _narrow(x2 * cos + x1 * sin, out_ptr), mask=ok)


@triton.jit
def _narrow(x, out_ptr):
    """``x`` in the element type of ``out_ptr``; into an fp8 cache it saturates at +-448 (e4m3 has no
    infinity: an out-of-range value would otherwise become NaN)."""
    if out_ptr.dtype.element_ty == tl.float8e4nv:
        x = _round_to_e4m3(tl.minimum(tl.maximum(x.to(tl.float32), -448.0), 448.0))
    return x.to(out_ptr.dtype.element_ty)


@triton.jit
def _round_to_e4m3(x):
    """float32 ``x`` (``|x| <= 448``) rounded to the nearest e4m3 value, ties to even, still in float32.
    The cast that follows is then exact: Triton's CPU interpreter drops the carry when its own rounding
    crosses a power of two (7.9 became 4), and the GPU's cvt gives the same bits either way."""
    exponent = tl.maximum(((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # subnormals below 2^-6
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits: 2^(e-3), exact
    r = x / step
    low = tl.floor(r)
    odd = (low - 2.0 * tl.floor(low * 0.5)) != 0.0
    up = (r - low > 0.5) | ((r - low == 0.5) & odd)
    return tl.where(up, low + 1.0, low) * step


@triton.jit
def _load_cos_sin(pos_ptr, cache_ptr, token, halves, half_ok, HEAD_DIM: tl.constexpr):
    pos = tl.load(pos_ptr + token)
    cos = tl.load(cache_ptr + pos * HEAD_DIM + halves, mask=half_ok, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + halves, mask=half_ok, other=0.0).to(tl.float32)[None, :]
    return cos, sin


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cache_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_q,
    stride_k,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    halves = tl.arange(0, BLOCK_HALF)
    half_ok = halves < HEAD_DIM // 2
    cos, sin = _load_cos_sin(pos_ptr, cache_ptr, token, halves, half_ok, HEAD_DIM)
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token * stride_q,
        token * NUM_Q_HEADS * HEAD_DIM,
        cos,
        sin,
        halves,
        half_ok,
        NUM_Q_HEADS,
        HEAD_DIM,
        BLOCK_HQ,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token * stride_k,
        token * NUM_KV_HEADS * HEAD_DIM,
        cos,
        sin,
        halves,
        half_ok,
        NUM_KV_HEADS,
        HEAD_DIM,
        BLOCK_HKV,
    )


@triton.jit
def _rotary_write_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    cache_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_q,
    stride_k,
    stride_v,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    halves = tl.arange(0, BLOCK_HALF)
    half_ok = halves < HEAD_DIM // 2
    cos, sin = _load_cos_sin(pos_ptr, cache_ptr, token, halves, half_ok, HEAD_DIM)
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token * stride_q,
        token * NUM_Q_HEADS * HEAD_DIM,
        cos,
        sin,
        halves,
        half_ok,
        NUM_Q_HEADS,
        HEAD_DIM,
        BLOCK_HQ,
    )
    # A padding token (slot -1) still needs its q rotated, but owns no cache slot.
    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        row = NUM_KV_HEADS * HEAD_DIM
        _rotate_heads(
            k_ptr,
            k_cache_ptr,
            token * stride_k,
            slot * row,
            cos,
            sin,
            halves,
            half_ok,
            NUM_KV_HEADS,
            HEAD_DIM,
            BLOCK_HKV,
        )
        cols = tl.arange(0, BLOCK_ROW)
        ok = cols < row
        v = tl.load(v_ptr + token * stride_v + cols, mask=ok)
        tl.store(v_cache_ptr + slot * row + cols, _narrow(v, v_cache_ptr), mask=ok)


def _check_rotary_args(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> int:
    """Validate the operands both launchers share; returns head_dim."""
    check_token_rows("q", q, dtypes=FLOAT_DTYPES)
    check_token_rows("k", k, dtypes=FLOAT_DTYPES, device=q.device)
    check_same_dtype(q.dtype, k=k)
    check_tensor("positions", positions, ndim=1, dtypes=(torch.int64,), device=q.device)
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES, device=q.device)
    head_dim = q.shape[2]
    if head_dim % 2:
        raise ValueError(f"q: expected an even head_dim, got {head_dim}")
    check_dim("k", k.shape[2], head_dim, "head_dim (q.shape[2])")
    check_dim("k", k.shape[0], q.shape[0], "number of tokens (q.shape[0])")
    check_dim("positions", positions.shape[0], q.shape[0], "number of tokens (q.shape[0])")
    check_dim("cos_sin_cache", cos_sin_cache.shape[1], head_dim, "head_dim (q.shape[2])")
    return head_dim


def _check_cache_args(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    check_token_rows("v", v, dtypes=FLOAT_DTYPES, device=k.device)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, ndim=4, dtypes=KV_CACHE_DTYPES, device=k.device)
    check_same_dtype(k.dtype, v=v)
    check_cache_dtype(k.dtype, k_cache, v_cache)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,), device=k.device)
    if v.shape != k.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    check_dim("k", k.shape[1], k_cache.shape[2], "num_kv_heads (k_cache.shape[2])")
    check_dim("k", k.shape[2], k_cache.shape[3], "head_dim (k_cache.shape[3])")
    check_dim("slot_mapping", slot_mapping.shape[0], k.shape[0], "number of tokens (k.shape[0])")


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hkv, D]`` by ``cos_sin_cache[positions]``.

    Returns new contiguous tensors; the inputs need contiguous rows per token but may be column
    slices of a fused QKV projection.
    """
    head_dim = _check_rotary_args(q, k, positions, cos_sin_cache)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0]:
        _rotary_kernel[(q.shape[0],)](
            q,
            k,
            positions,
            cos_sin_cache,
            q_out,
            k_out,
            q.stride(0),
            k.stride(0),
            NUM_Q_HEADS=q.shape[1],
            NUM_KV_HEADS=k.shape[1],
            HEAD_DIM=head_dim,
            BLOCK_HQ=next_pow2(q.shape[1]),
            BLOCK_HKV=next_pow2(k.shape[1]),
            BLOCK_HALF=next_pow2(head_dim // 2),
        )
    return q_out, k_out


def rotary_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """``apply_rotary`` then ``write_kv_cache`` of the rotated k and v, in one launch.

    Returns the rotated q as a new contiguous ``[T, Hq, D]`` tensor; the rotated k and the
    unchanged v of token ``t`` land only in ``k_cache``/``v_cache`` at ``slot_mapping[t]``
    (slot -1 marks padding: its q is rotated, nothing is cached). q, k and v need contiguous
    rows per token but may be column slices of a fused QKV projection.
    """
    head_dim = _check_rotary_args(q, k, positions, cos_sin_cache)
    _check_cache_args(k, v, k_cache, v_cache, slot_mapping)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[0]:
        _rotary_write_kv_kernel[(q.shape[0],)](
            q,
            k,
            v,
            positions,
            cos_sin_cache,
            q_out,
            k_cache,
            v_cache,
            slot_mapping,
            q.stride(0),
            k.stride(0),
            v.stride(0),
            NUM_Q_HEADS=q.shape[1],
            NUM_KV_HEADS=k.shape[1],
            HEAD_DIM=head_dim,
            BLOCK_HQ=next_pow2(q.shape[1]),
            BLOCK_HKV=next_pow2(k.shape[1]),
            BLOCK_HALF=next_pow2(head_dim // 2),
            BLOCK_ROW=next_pow2(k.shape[1] * head_dim),
        )
    return q_out
