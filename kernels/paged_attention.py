"""Triton paged attention over the block-table KV cache: decode (one query per sequence) and
varlen causal prefill over a cached prefix. Same signatures as ``kernels.reference``.

Both kernels pack the query heads that share one KV head into the M dimension of one program, so
each K/V tile is read from memory once per KV head rather than once per query head (GQA).

Decode splits each sequence's context into ``num_splits`` ranges (split-KV) so that small batches
still fill the GPU; each split writes a partial output and its log-sum-exp, and either the last
split program of each (sequence, KV head) to finish merges them, or a second kernel does. The
split count depends only on tensor shapes (batch, KV heads, block-table width), never on
``seq_lens`` values, so a launch is CUDA-graph capturable and needs no host sync: pass
block tables only as wide as the batch's longest context needs, since splits cover the table width.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import (
    FLOAT_DTYPES,
    KV_CACHE_DTYPES,
    check_cache_dtype,
    check_dim,
    check_tensor,
    interpreting,
    next_pow2,
)

_LOG2E = 1.4426950408889634
_MAX_SPLITS = 64
# The in-kernel merge loads its partials as one [group, splits, head_dim] fp32 tile; past this many
# elements per thread the tile would spill registers, so more splits are merged in chunks of splits
# (each chunk one independent load, not a chain). 128 keeps 32 splits of a GQA-4, head_dim-128
# group in one load at 4 warps; compiled for sm_90, 256 per thread (64 splits in one load) added
# about 400 bytes of register spills per thread; 128 stays within about 64 bytes of the split
# loop's own spills.
_MERGE_ELEMS_PER_THREAD = 128


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the split-KV decode kernel."""

    block_n: int = 64  # KV tokens per inner-loop tile
    num_warps: int = 4
    num_stages: int = 3
    # At most this many (sequence, KV head, split) programs, unless one split per (sequence, KV
    # head) already exceeds it: the split count grows while batch x KV heads x splits stays within
    # it, so small batches get more splits than large ones and no launch spills into a second,
    # mostly empty wave of programs.
    target_programs: int = 396
    # Never split a context finer than this many tokens: the split granularity of small batches,
    # whose split count target_programs alone would push up to _MAX_SPLITS. Each split is also
    # rounded up to whole block_n tiles, so min_split_tokens == block_n gives one tile per split.
    min_split_tokens: int = 256
    # Merge splits in the last program of each (sequence, KV head) to finish, found through an
    # atomic counter, instead of in a second kernel: one launch fewer per call. Launches that may
    # run at once (on two streams) must not share counters: each caller passes its own
    # (``split_counters``), or they share the device's and one stream.
    fused_reduce: bool = True
    # Merge in-kernel only up to this many splits; a launch with more splits runs the second
    # kernel. The merging program loads every partial of its query-head group at once, so its cost
    # grows with the partials' bytes rather than with a chain of per-split loads. The split count
    # is a function of shapes, so this choice is too: launches stay CUDA-graph capturable.
    fused_max_splits: int = 8

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"DecodeConfig.block_n: expected a power of two >= 16, got {self.block_n}")
        if self.target_programs < 1 or self.min_split_tokens < 1:
            raise ValueError(
                "DecodeConfig: target_programs and min_split_tokens must be positive, got "
                f"{self.target_programs} and {self.min_split_tokens}"
            )
        if self.fused_max_splits < 1:
            raise ValueError(f"DecodeConfig.fused_max_splits: expected a positive count, got {self.fused_max_splits}")

    def merges_in_kernel(self, num_splits: int) -> bool:
        """Whether a launch of ``num_splits`` splits merges them in the split kernel itself."""
        return self.fused_reduce and 1 < num_splits <= self.fused_max_splits


@dataclass(frozen=True)
class PrefillConfig:
    """Launch parameters of the varlen prefill kernel."""

    block_m: int = 128  # query rows (tokens x padded GQA group) per program
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


def num_decode_splits(batch: int, num_kv_heads: int, max_context: int, config: DecodeConfig) -> tuple[int, int]:
    """(num_splits, tokens_per_split) for a decode launch; a function of shapes only."""
    base = max(1, batch * num_kv_heads)
    splits = min(
        config.target_programs // base,
        max(1, max_context // config.min_split_tokens),
        _MAX_SPLITS,
    )
    splits = max(1, splits)
    per_split = math.ceil(math.ceil(max_context / splits) / config.block_n) * config.block_n
    per_split = max(per_split, config.block_n)
    return math.ceil(max_context / per_split) if max_context > 0 else 1, per_split


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_decode_config(
    q: torch.Tensor, num_kv_heads: int = 1, max_context: int = 0, kv_element_size: int | None = None
) -> DecodeConfig:
    """Decode launch parameters for ``q``'s device and a launch of ``q.shape[0]`` sequences over
    ``num_kv_heads`` KV heads and block tables covering ``max_context`` tokens (shapes only, so the
    choice is CUDA-graph capturable) of a cache of ``kv_element_size``-byte elements (None: ``q``'s).
    The CPU interpreter gets small tiles."""
    if q.device.type != "cuda":
        return DecodeConfig(block_n=32, num_warps=4, num_stages=1, target_programs=16, min_split_tokens=32)
    return gpu_decode_config(
        _sm_count(q.device.index or 0),
        q.shape[0],
        num_kv_heads,
        max_context,
        head_dim=q.shape[-1],
        element_size=kv_element_size or q.element_size(),
    )


# What the pipeliner makes of each tile on sm_90 for bf16 and head_dim 128 (Triton 3.6; compiled
# sizes in docs/benchmarks.md): 64-token tiles at 3 stages keep one K/V tile in flight in 39 KB of
# shared memory (four programs per SM by registers), 5 stages two tiles in 72 KB (three per SM),
# 128-token tiles at 6 stages two tiles in 140 KB (one program per SM).
_MANY_PAIRS = DecodeConfig(block_n=64, num_stages=3, min_split_tokens=64, fused_max_splits=32)
_MANY_PAIRS_FP8 = replace(_MANY_PAIRS, block_n=128, min_split_tokens=128)  # the bytes of bf16's 64 tokens
_SOME_PAIRS = DecodeConfig(block_n=64, num_stages=5, min_split_tokens=64, fused_max_splits=32)
_FEW_PAIRS = DecodeConfig(block_n=128, num_stages=6, min_split_tokens=128, fused_max_splits=32)
_TILE_BYTES = 128 * 128 * 2  # the largest K tile above; wider heads or elements get fewer tokens


def gpu_decode_config(
    sm_count: int,
    batch: int = 1,
    num_kv_heads: int = 1,
    max_context: int = 0,
    *,
    head_dim: int = 128,
    element_size: int = 2,
) -> DecodeConfig:
    """The decode launch parameters of a GPU with ``sm_count`` SMs for a launch of ``batch`` x
    ``num_kv_heads`` (sequence, KV head) pairs over ``max_context`` tokens of a cache of
    ``element_size``-byte elements.

    Decode streams K/V, so what counts is the bytes in flight across the GPU while every program
    fits in one wave. Swept on an H200 (docs/benchmarks.md, "Paged decode attention"):
    - two or more pairs per SM: one split each, 64-token tiles at 3 stages (small programs balance
      the waves);
    - one to two pairs per SM: one split, two 64-token tiles in flight (three programs per SM);
    - a quarter to one pair per SM: 128-token tiles, two in flight, one program per SM, split until
      the SMs are used, unless the context is so short that those splits would leave most SMs idle;
    - fewer pairs, or too short a context: 64-token one-tile splits, merged in-kernel up to 32. An
      engine's block tables are as wide as its longest allowed context, which is this choice's
      only view of the context, while a batch-1 decode mostly reads far fewer tokens; many
      one-tile splits then keep its latency low (on the H200 the 128-token splits made the 8B
      model's batch-1 decode graph 4.33 ms against 4.17-4.28).
    With two or more pairs per SM an fp8 cache takes 128-token tiles, the bytes of bf16's 64: on an
    H100 they took 6-26% less time than 64-token ones at 64-256 sequences of 512-2,048 tokens (64-token
    fp8 tiles reached 47-73% of the copy bandwidth, bf16's 89-100%).
    Tiles hold at most 128 tokens of bf16 head_dim 128; wider rows get proportionally fewer tokens.
    """
    pairs = max(1, batch * num_kv_heads)
    if pairs >= 2 * sm_count and element_size < 2:
        config = replace(_MANY_PAIRS_FP8, target_programs=3 * sm_count)
    elif sm_count <= pairs < 2 * sm_count:
        config = replace(_SOME_PAIRS, target_programs=3 * sm_count)
    elif sm_count // 4 <= pairs < sm_count and pairs * (max_context // _FEW_PAIRS.block_n) >= sm_count // 2:
        config = replace(_FEW_PAIRS, target_programs=sm_count)
    else:  # many pairs, or too few / too short a context for the coarse splits
        config = replace(_MANY_PAIRS, target_programs=3 * sm_count)
    block_n = max(16, min(config.block_n, _TILE_BYTES // (next_pow2(head_dim) * element_size)))
    return replace(config, block_n=block_n, min_split_tokens=min(config.min_split_tokens, block_n))


def decode_launch_key(
    sm_count: int, batch: int, num_kv_heads: int, max_context: int, *, head_dim: int = 128, element_size: int = 2
) -> tuple[int, ...]:
    """What a GPU decode launch of this shape compiles for (its tile, pipeline depth and split
    constexprs): two shapes with one key run one compiled kernel, so a warm-up needs one shape per key."""
    config = gpu_decode_config(sm_count, batch, num_kv_heads, max_context, head_dim=head_dim, element_size=element_size)
    num_splits, _ = num_decode_splits(batch, num_kv_heads, max_context, config)
    fused = config.merges_in_kernel(num_splits)
    return (config.block_n, config.num_warps, config.num_stages, num_splits == 1, fused, max(2, next_pow2(num_splits)))


def default_prefill_config(q: torch.Tensor) -> PrefillConfig:
    """Prefill launch parameters: the H200 sweep's best 96 KB-shared-memory tile, small tiles on the CPU."""
    if q.device.type != "cuda":
        return PrefillConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)
    return PrefillConfig()


@triton.jit
def _paged_scores(
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
        qk, v = _paged_scores(
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


def _check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor) -> None:
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
    _check_cache(q, k_cache, v_cache, block_tables)
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
        scale * _LOG2E,
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
        qk, v = _paged_scores(
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
    _check_cache(q, k_cache, v_cache, block_tables)
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
        scale * _LOG2E,
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
