"""What the paged attention kernels share: reading one tile of the block-table KV cache into q·k scores
and V rows, and checking a cache against its queries."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import KV_CACHE_DTYPES, check_cache_dtype, check_dim, check_tensor

LOG2E = 1.4426950408889634


@triton.jit
def paged_scores(
    q,
    k_cache_ptr,
    v_cache_ptr,
    table_row,
    offs,
    tok_ok,
    kvh,
    dims,
    dim_ok,
    stride_cache_block,
    stride_cache_tok,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Unscaled q·k scores of the cached positions ``offs`` of one sequence (its block-table row), and
    their V rows; positions outside ``tok_ok`` read as zeros. Shared by the decode and prefill kernels."""
    page = tl.load(table_row + offs // PAGE, mask=tok_ok, other=0).to(tl.int64)
    kv_off = page * stride_cache_block + (offs % PAGE) * stride_cache_tok + kvh * HEAD_DIM
    kv_ptrs = kv_off[:, None] + dims[None, :]
    kv_mask = tok_ok[:, None] & dim_ok[None, :]
    # An fp8 cache (scale 1: the caller folds per-tensor scales into the softmax scale and output)
    # widens to float16, exactly and in one conversion per pair (to bfloat16 each value took a second one),
    # and the query meets it there, clamped to float16's range; a cache in the query's dtype is read as it is.
    if k_cache_ptr.dtype.element_ty.is_fp8() and not DOT_FP32:
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    k = tl.load(k_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0).to(q.dtype)
    v = tl.load(v_cache_ptr + kv_ptrs, mask=kv_mask, other=0.0).to(q.dtype)
    if DOT_FP32:
        # fp32 inputs want exact products; the CPU interpreter also mis-multiplies 16-bit
        # floats, so there both operands go through fp32 (values stay those of the 16-bit type).
        qk = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    return qk, v


def check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor) -> None:
    check_tensor("k_cache", k_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=q.device)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=q.device)
    check_cache_dtype(q.dtype, k_cache, v_cache)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    check_dim("q", q.shape[-1], head_dim, "head_dim (k_cache.shape[3])")
    if q.shape[1] % num_kv_heads:
        raise ValueError(
            f"q: expected a number of query heads divisible by num_kv_heads={num_kv_heads}, got {q.shape[1]}"
        )
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,), device=q.device)
