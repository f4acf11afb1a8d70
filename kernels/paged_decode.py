"""Triton paged decode attention over the block-table KV cache: one query per sequence, the same
signature as ``kernels.reference``. Launch parameters: kernels/attention_config.py.

A program packs the query heads that share one KV head into the M dimension of its tiles, so each K/V
tile is read from memory once per KV head rather than once per query head (GQA).

Each sequence's context is split into ``num_splits`` ranges (split-KV) so that small batches still
fill the GPU; each split writes a partial output and its log-sum-exp, and either the last split
program of each (sequence, KV head) to finish merges them, or a second kernel does. The split count
depends only on tensor shapes (batch, KV heads, block-table width), never on ``seq_lens`` values, so
a launch is CUDA-graph capturable and needs no host sync: pass block tables only as wide as the
batch's longest context needs, since splits cover the table width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.attention_config import DecodeConfig, default_decode_config, num_decode_splits
from omni_gateway.kernels.paged_kv import LOG2E, check_cache, paged_scores
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_dim, check_tensor, interpreting, next_pow2

# The in-kernel merge loads its partials as one [group, splits, head_dim] fp32 tile; past this many
# elements per thread the tile would spill registers, so more splits are merged in chunks of splits
# (each chunk one independent load, not a chain). 128 keeps 32 splits of a GQA-4, head_dim-128
# group in one load at 4 warps; compiled for sm_90, 256 per thread (64 splits in one load) added
# about 400 bytes of register spills per thread; 128 stays within about 64 bytes of the split
# loop's own spills.
_MERGE_ELEMS_PER_THREAD = 128


@triton.jit
def _merge_group_splits(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    b,
    kvh,
    num_splits,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    MERGE_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    MERGE_S: tl.constexpr,
):
    """Merge every split's partial output of one (sequence, KV head)'s query heads into ``out``.

    The partials of a group are one contiguous [GROUP, num_splits, HEAD_DIM] block, loaded as a 3-D
    tile weighted by exp2(lse - max) and summed over the split axis. MERGE_S < BLOCK_S only when the
    whole tile would not fit in registers; each chunk's loads still depend on no earlier chunk.
    Loads bypass L1 (.cg): the other splits' partials were written by other programs, whose stores
    reach this one through L2 after the caller's acquire.
    """
    rows = tl.arange(0, MERGE_G)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = (b * NUM_Q_HEADS + kvh * GROUP + rows).to(tl.int64)
    first = heads * num_splits  # partial index of each head's split 0

    lse_all = tl.load(
        part_lse_ptr + first[:, None] + splits[None, :],
        mask=row_ok[:, None] & (splits < num_splits)[None, :],
        other=float("-inf"),
        cache_modifier=".cg",
    )
    m_all = tl.max(lse_all, 1)
    m_all = tl.where(m_all > float("-inf"), m_all, 0.0)  # every split empty: weights all 0, output 0
    denom = tl.sum(tl.exp2(lse_all - m_all[:, None]), 1)
    denom = tl.where(denom > 0, denom, 1.0)

    chunk = tl.arange(0, MERGE_S)
    merged = tl.zeros([MERGE_G, BLOCK_D], tl.float32)
    for s0 in range(0, num_splits, MERGE_S):
        sp = s0 + chunk
        sp_ok = row_ok[:, None] & (sp < num_splits)[None, :]
        part = first[:, None] + sp[None, :]  # [MERGE_G, MERGE_S]
        lse = tl.load(part_lse_ptr + part, mask=sp_ok, other=float("-inf"), cache_modifier=".cg")
        weight = tl.exp2(lse - m_all[:, None])
        parts = tl.load(
            part_out_ptr + part[:, :, None] * HEAD_DIM + dims[None, None, :],
            mask=sp_ok[:, :, None] & dim_ok[None, None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        merged += tl.sum(parts * weight[:, :, None], 1)
    out_off = heads[:, None] * HEAD_DIM + dims[None, :]
    tl.store(
        out_ptr + out_off,
        (merged / denom[:, None]).to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


# Triton compiles an int argument anew for each value class it specializes on (== 1, divisible by 16).
# Counts that change with every step (splits, block-table width, sequences) are passed unspecialized,
# so a new batch or context length reuses the kernel compiled at warm-up. The per-model constants
# (strides) stay specialized, and so does tokens_per_split: a multiple of the tile (16 or more), it is
# always in the same class, and the hint keeps the tile offsets aligned.
@triton.jit(do_not_specialize=["max_blocks", "num_splits"])
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    counters_ptr,
    qk_scale,
    max_blocks,
    tokens_per_split,
    num_splits,
    stride_cache_block,
    stride_cache_tok,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_FP32: tl.constexpr,
    MERGE_G: tl.constexpr,
    MERGE_S: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kvh * GROUP + rows
    q_off = (b * NUM_Q_HEADS + heads).to(tl.int64)[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + b.to(tl.int64) * max_blocks
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        tok_ok = offs < end
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
        qk = tl.where(tok_ok[None, :], qk * qk_scale, float("-inf"))
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

    # A split past the end of its sequence (or a zero-length padding sequence) saw no keys.
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out_mask = row_ok[:, None] & dim_ok[None, :]
    if SINGLE_SPLIT:
        tl.store(out_ptr + q_off, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = (b * NUM_Q_HEADS + heads).to(tl.int64) * num_splits + split
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc / l_safe[:, None], mask=out_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_ok)
        if FUSED_REDUCE:
            # The barrier orders every thread's partial stores before the release of the counter
            # increment; the acquire side then reads the other splits' partials from L2 (.cg).
            tl.debug_barrier()
            counter = counters_ptr + b * NUM_KV_HEADS + kvh
            finished = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if finished == num_splits - 1:
                _merge_group_splits(
                    part_out_ptr,
                    part_lse_ptr,
                    out_ptr,
                    b,
                    kvh,
                    num_splits,
                    NUM_Q_HEADS,
                    GROUP,
                    MERGE_G,
                    HEAD_DIM,
                    BLOCK_D,
                    BLOCK_S,
                    MERGE_S,
                )
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_ok = splits < num_splits
    dim_ok = dims < HEAD_DIM
    base = (b * NUM_Q_HEADS + h).to(tl.int64) * num_splits
    lse = tl.load(part_lse_ptr + base + splits, mask=split_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m > float("-inf"), m, 0.0)  # every split empty: weights all 0, output 0
    weight = tl.exp2(lse - m)
    denom = tl.sum(weight, 0)
    denom = tl.where(denom > 0, denom, 1.0)
    parts = tl.load(
        part_out_ptr + (base + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    out = tl.sum(parts * weight[:, None], 0) / denom
    out_off = (b * NUM_Q_HEADS + h).to(tl.int64) * HEAD_DIM + dims
    tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


# Zeroed once and left zeroed by each launch (the merging program resets its counter), so they
# can live across calls and CUDA-graph replays. Never freed: a captured graph keeps their address.
_COUNTERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown counters, kept alive for graphs captured with them
_MIN_COUNTERS = 1 << 16


def split_counters(device: torch.device, size: int = _MIN_COUNTERS) -> torch.Tensor:
    """Zeroed split-merge counters of a caller's own, for ``size`` (sequence, KV head) pairs per launch:
    what an engine stepping beside another on the same device passes to ``paged_decode_attention``.
    Allocate them before any CUDA-graph capture that uses them, and keep them while its graphs live."""
    return torch.zeros(size, dtype=torch.int32, device=device)


def _device_counters(device: torch.device, needed: int) -> torch.Tensor:
    counters = _COUNTERS.get(device)
    if counters is None or counters.numel() < needed:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"paged_decode_attention: split counters for {needed} (sequence, KV head) pairs must be "
                "allocated before CUDA-graph capture; run the largest batch once eagerly first"
            )
        counters = split_counters(device, max(needed, _MIN_COUNTERS))
        if device in _COUNTERS:
            _RETIRED.append(_COUNTERS[device])
        _COUNTERS[device] = counters
    return counters


def _merge_chunk_splits(merge_g: int, block_s: int, block_d: int, num_warps: int) -> int:
    """Splits per load of the in-kernel merge: all of them unless the tile outgrows the register budget."""
    budget = _MERGE_ELEMS_PER_THREAD * 32 * num_warps
    chunk = block_s
    while chunk > 2 and merge_g * chunk * block_d > budget:
        chunk //= 2
    return chunk


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    config: DecodeConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence over its ``seq_lens[b]`` cached positions -> ``[B, Hq, D]``. ``counters``
    (``split_counters``): the caller's own for the in-kernel merge; None: the device's, shared by
    every launch without its own, which must then run on one stream."""
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_cache(q, k_cache, v_cache, block_tables)
    check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), device=q.device)
    if counters is not None:
        check_tensor("counters", counters, ndim=1, dtypes=(torch.int32,), device=q.device)
    batch, num_q_heads, head_dim = q.shape
    check_dim("seq_lens", seq_lens.shape[0], batch, "batch size (q.shape[0])")
    check_dim("block_tables", block_tables.shape[0], batch, "batch size (q.shape[0])")
    out = torch.empty_like(q)
    if batch == 0:
        return out
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    config = config or default_decode_config(q, num_kv_heads, block_tables.shape[1] * page, k_cache.element_size())
    group = num_q_heads // num_kv_heads
    max_blocks = block_tables.shape[1]
    num_splits, per_split = num_decode_splits(batch, num_kv_heads, max_blocks * page, config)
    if num_splits > 1:
        part_out = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused by the single-split specialization
    fused = config.merges_in_kernel(num_splits)
    if not fused:
        counters = seq_lens  # unused
    elif counters is None:
        counters = _device_counters(q.device, batch * num_kv_heads)
    elif counters.numel() < batch * num_kv_heads:
        raise ValueError(
            f"counters: expected at least {batch * num_kv_heads} for {batch} sequences x {num_kv_heads} KV heads, "
            f"got {counters.numel()}"
        )
    block_d = max(16, next_pow2(head_dim))
    block_s = max(2, next_pow2(num_splits))
    merge_g = max(2, next_pow2(group))
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_out,
        part_lse,
        counters,
        scale * LOG2E,
        max_blocks,
        per_split,
        num_splits,
        k_cache.stride(0),
        k_cache.stride(1),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        BLOCK_G=max(16, next_pow2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=config.block_n,
        PAGE=page,
        SINGLE_SPLIT=num_splits == 1,
        FUSED_REDUCE=fused,
        BLOCK_S=block_s,
        DOT_FP32=q.dtype == torch.float32 or interpreting(),
        MERGE_G=merge_g,
        MERGE_S=_merge_chunk_splits(merge_g, block_s, block_d, config.num_warps),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if num_splits > 1 and not fused:
        _decode_reduce_kernel[(batch, num_q_heads)](
            part_out,
            part_lse,
            out,
            num_splits,
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_S=block_s,
            num_warps=4,
        )
    return out
