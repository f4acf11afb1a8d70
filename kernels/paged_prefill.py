"""Triton varlen causal prefill attention over a cached prefix in the block-table KV cache, the same
signature as ``kernels.reference``. As in the decode kernel (kernels/paged_decode.py), a program packs
the query heads that share one KV head into the M dimension of its tiles (GQA), so each K/V tile is
read once per KV head."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.attention_config import PrefillConfig, default_prefill_config
from omni_gateway.kernels.paged_kv import LOG2E, check_cache, paged_scores
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_dim, check_tensor, interpreting, next_pow2


@triton.jit(do_not_specialize=["num_seqs", "max_blocks"])
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    cu_seqlens_ptr,
    out_ptr,
    qk_scale,
    num_seqs,
    max_blocks,
    stride_cache_block,
    stride_cache_tok,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    # Sequence b's tiles start at cu_seqlens[b] // BLOCK_Q + b: an upper bound on the tiles of the
    # sequences before it, so the grid needs no host-side knowledge of query lengths.
    lo = tl.zeros([], dtype=tl.int32)
    hi = lo + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_seqlens_ptr + mid) // BLOCK_Q + mid
        right = first_tile <= pid
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(right, hi, mid)
    seq = lo - 1
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return
    ctx = tl.load(seq_lens_ptr + seq)
    prefix = ctx - q_len

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    tok = tile * BLOCK_Q + rows // GROUP_PAD
    in_group = rows % GROUP_PAD
    row_ok = (in_group < GROUP) & (tok < q_len)
    dim_ok = dims < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64) * NUM_Q_HEADS + kvh * GROUP + in_group
    q_off = q_rows[:, None] * HEAD_DIM + dims[None, :]
    io_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + q_off, mask=io_mask, other=0.0)
    # Padding rows (tok >= q_len) sit past the context end, so they see every key and stay finite.
    q_pos = prefix + tok

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * max_blocks
    kv_end = tl.minimum(prefix + (tile + 1) * BLOCK_Q, ctx)
    for n0 in range(0, kv_end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        tok_ok = offs < kv_end
        qk, v = paged_scores(
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
            HEAD_DIM,
            PAGE,
            DOT_FP32,
        )
        allowed = (offs[None, :] <= q_pos[:, None]) & tok_ok[None, :]
        qk = tl.where(allowed, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p_lo = p.to(v.dtype)
        if DOT_FP32:
            pv = tl.dot(p_lo.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p_lo, v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    tl.store(out_ptr + q_off, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Varlen causal attention of each sequence's new queries over its cached context -> ``[T, Hq, D]``."""
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_cache(q, k_cache, v_cache, block_tables)
    check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=q.device)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=q.device)
    num_seqs = seq_lens.shape[0]
    check_dim("cu_seqlens_q", cu_seqlens_q.shape[0], num_seqs + 1, "len(seq_lens) + 1")
    check_dim("block_tables", block_tables.shape[0], num_seqs, "len(seq_lens)")
    out = torch.empty_like(q)
    total, num_q_heads, head_dim = q.shape
    if total == 0 or num_seqs == 0:
        return out
    config = config or default_prefill_config(q)
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    group_pad = next_pow2(group)
    block_m = max(config.block_m, group_pad, 16)
    block_q = block_m // group_pad
    _prefill_kernel[(total // block_q + num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        cu_seqlens_q,
        out,
        scale * LOG2E,
        num_seqs,
        block_tables.shape[1],
        k_cache.stride(0),
        k_cache.stride(1),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, next_pow2(head_dim)),
        BLOCK_N=config.block_n,
        PAGE=page,
        DOT_FP32=q.dtype == torch.float32 or interpreting(),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
