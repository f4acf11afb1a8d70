"""Triton NeoX-style rotary embedding (same signature as ``kernels.reference``)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.validation import FLOAT_DTYPES, check_dim, check_same_dtype, check_tensor, check_token_rows, next_pow2


@triton.jit
def _rotate_heads(x_ptr, out_ptr, token, stride_token, cos, sin, halves, half_ok,
                  NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    ok = (heads < NUM_HEADS)[:, None] & half_ok[None, :]
    cols = heads[:, None] * HEAD_DIM + halves[None, :]
    src = token * stride_token + cols
    dst = token * NUM_HEADS * HEAD_DIM + cols
    x1 = tl.load(x_ptr + src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + src + HEAD_DIM // 2, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + dst, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(out_ptr + dst + HEAD_DIM // 2, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr, q_out_ptr, k_out_ptr, stride_q, stride_k,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token)
    halves = tl.arange(0, BLOCK_HALF)
    half_ok = halves < HEAD_DIM // 2
    cos = tl.load(cache_ptr + pos * HEAD_DIM + halves, mask=half_ok, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + halves, mask=half_ok, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, q_out_ptr, token, stride_q, cos, sin, halves, half_ok, NUM_Q_HEADS, HEAD_DIM, BLOCK_HQ)
    _rotate_heads(k_ptr, k_out_ptr, token, stride_k, cos, sin, halves, half_ok, NUM_KV_HEADS, HEAD_DIM, BLOCK_HKV)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hkv, D]`` by ``cos_sin_cache[positions]``.

    Returns new contiguous tensors; the inputs need contiguous rows per token but may be column
    slices of a fused QKV projection.
    """
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
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0]:
        _rotary_kernel[(q.shape[0],)](
            q, k, positions, cos_sin_cache, q_out, k_out, q.stride(0), k.stride(0),
            NUM_Q_HEADS=q.shape[1], NUM_KV_HEADS=k.shape[1], HEAD_DIM=head_dim,
            BLOCK_HQ=next_pow2(q.shape[1]), BLOCK_HKV=next_pow2(k.shape[1]),
            BLOCK_HALF=next_pow2(head_dim // 2),
        )
    return q_out, k_out
