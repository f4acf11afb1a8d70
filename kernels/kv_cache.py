"""Triton scatter of new tokens' K/V into the paged cache (same signature as ``kernels.reference``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import (
    FLOAT_DTYPES,
    check_dim,
    check_same_dtype,
    check_tensor,
    check_token_rows,
    next_pow2,
)


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_k,
    stride_v,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    cols = tl.arange(0, BLOCK)
    ok = cols < ROW
    t64 = t.to(tl.int64)
    dst = slot * ROW + cols
    tl.store(k_cache_ptr + dst, tl.load(k_ptr + t64 * stride_k + cols, mask=ok), mask=ok)
    tl.store(v_cache_ptr + dst, tl.load(v_ptr + t64 * stride_v + cols, mask=ok), mask=ok)


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter token ``t``'s K/V (``[T, Hkv, D]``) to ``slot_mapping[t]``; slot -1 is skipped.

    ``k`` and ``v`` need contiguous rows per token but may be column slices of a fused projection.
    """
    check_token_rows("k", k, dtypes=FLOAT_DTYPES)
    check_token_rows("v", v, dtypes=FLOAT_DTYPES, device=k.device)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, ndim=4, dtypes=FLOAT_DTYPES, device=k.device)
    check_same_dtype(k.dtype, v=v, k_cache=k_cache, v_cache=v_cache)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,), device=k.device)
    if v.shape != k.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    check_dim("k", k.shape[1], k_cache.shape[2], "num_kv_heads (k_cache.shape[2])")
    check_dim("k", k.shape[2], k_cache.shape[3], "head_dim (k_cache.shape[3])")
    check_dim("slot_mapping", slot_mapping.shape[0], k.shape[0], "number of tokens (k.shape[0])")
    if k.shape[0] == 0:
        return
    row = k.shape[1] * k.shape[2]
    _write_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0), ROW=row, BLOCK=next_pow2(row)
    )
