"""Decode-sized weight-only quantized linears (1 to ``quant_tuning.MAX_GEMV_ROWS`` rows): the kernel
that streams the quantized weight once and de-quantizes it in registers. Formats:
kernels/quant_reference.py.

Decode is memory-bound, so what matters is bytes in flight and few ALU operations per weight:

- one row: each program owns ``block_n`` output features and accumulates elementwise products into a
  ``[block_n, block_k]`` tile that is summed once at the end (no cross-lane reduction in the loop).
  FP8 per block walks 128-wide sub-tiles and folds each one's block scale (one per program: its
  features lie in one block row) into the activations, so the weight tile sees one convert and one
  FMA per element.
- int4 reads 32-bit words, eight weights each, as nibble planes (kernels/quant_tiles.py).
- 2+ rows: the de-quantized tile (raw FP8 value, or int4's ``1 + q / 16``: both exact in bf16) goes to
  ``tl.dot`` against a 16-row activation tile, and the group/block scale multiplies the partial sums.
  int4 first takes ``1 + zero / 16`` times the activations' sums off them, sums that a second ``tl.dot``,
  against ones, gives in the accumulator's own layout (a reduction across threads cost more). One int4
  row padded to 16 this way issues fewer instructions a weight than the planes, yet ran 1.6-2.0x slower
  on an H100 at every 8B shape (``benchmarks.quant_sweep``, 2026-12-06), so one row stays on the planes.
- split-K (``split_k`` > 1): when a layer has few output blocks, ``split_k`` programs share each one
  and write float32 partial sums; the last to finish (an atomic counter per output block, reset by
  that program) adds them up and runs the epilogue. One launch, no memset, no reduce kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.quant_tiles import (
    dot_tile,
    int4_dot_features,
    int4_row_start,
    int4_row_step,
    int4_row_total,
    int4_words,
)
from omni_gateway.kernels.quant_tuning import FP8_CHANNEL, INT4_GROUPED, QuantLinearConfig
from omni_gateway.kernels.row_fusion import (
    RowFusion,
    dependent_launch_start,
    norm_input,
    pdl,
    row_columns,
    row_epilogue,
    row_squares,
)

# Split-K counters, one set per device (a launch needing more runs unsplit). Launches on one device take
# them in stream order, so split launches must not overlap on two streams at once: engines in one
# process step on one stream (a speaking model's thinker and talker), and the talker never runs
# quantized linears.
_LOCKS = 1 << 16
_locks: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _epilogue(
    acc, rows, cols, row_ok, col_ok, s_ptr, bias_ptr, out_ptr, N, FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr
):
    out = acc
    if FORMAT == 0:
        out *= tl.load(s_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    lock_ptr,
    norm_ptr,
    res_ptr,
    M,
    N,
    K,
    stride_xm,
    k_per_split,
    eps,
    FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
    ROW_TILE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    ROW_FUSED: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    PDL: tl.constexpr,
):
    dependent_launch_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols, col_ok = row_columns(pid_n, N, GATED, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if USE_DOT:
        squares = tl.zeros([1], tl.float32)  # no fused norm with more than one row
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
            for u in tl.static_range(BLOCK_K // SUB):
                kb = k0 + u * SUB
                if FORMAT == 2:
                    ks = int4_dot_features(kb, SUB)  # the weight tile's column order
                else:
                    ks = kb + tl.arange(0, SUB)
                if EVEN:
                    x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None], other=0.0)
                else:
                    x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0)
                if DOT_FP32:
                    x = x.to(tl.float32)
                w, scale, offset = dot_tile(
                    w_ptr, s_ptr, z_ptr, cols, col_ok, kb, K, x, EVEN, FORMAT, GROUP, SUB, ROW_TILE
                )
                if DOT_FP32:
                    part = tl.dot(x, tl.trans(w), input_precision="ieee")
                else:
                    part = tl.dot(x, tl.trans(w))
                if FORMAT == 0:
                    acc += part
                elif FORMAT == 2:
                    ones = tl.full([SUB, BLOCK_N], 1.0, x.dtype)
                    if DOT_FP32:
                        x_sum = tl.dot(x, ones, input_precision="ieee")
                    else:
                        x_sum = tl.dot(x, ones)
                    acc += (part - x_sum * offset[None, :]) * scale[None, :]
                else:
                    acc += part * scale[None, :]
    elif FORMAT == 2:
        w_rows = w_ptr + int4_row_start(cols, K, GROUP, ROW_TILE, 8)[:, None]
        acc2 = tl.zeros([BLOCK_N, SUB // 8], tl.float32)
        squares2 = tl.zeros([1, SUB // 8], tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
            for u in tl.static_range(BLOCK_K // SUB):
                kb = k0 + u * SUB
                acc2, squares2 = int4_row_step(
                    int4_words(w_rows, col_ok, kb, K, EVEN, SUB, GROUP, ROW_TILE),
                    x_ptr,
                    s_ptr,
                    z_ptr,
                    norm_ptr,
                    cols,
                    col_ok,
                    kb,
                    K,
                    acc2,
                    squares2,
                    EVEN,
                    GROUP,
                    SUB,
                    NORM,
                )
        acc = int4_row_total(acc2)
        squares = tl.sum(squares2, 0)
    else:
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
        if FORMAT == 1:
            # block_n divides 128: every feature of the program shares this row of block scales.
            s_row = s_ptr + (pid_n * BLOCK_N // GROUP) * tl.cdiv(K, GROUP)
        acc2 = tl.zeros([BLOCK_N, SUB], tl.float32)
        squares = tl.zeros([SUB], tl.float32)
        for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
            for u in tl.static_range(BLOCK_K // SUB):
                ks = k0 + u * SUB + tl.arange(0, SUB)
                if EVEN:
                    w = tl.load(w_rows + ks[None, :], eviction_policy="evict_first")
                    x = tl.load(x_ptr + ks).to(tl.float32)
                else:
                    w = tl.load(
                        w_rows + ks[None, :],
                        mask=col_ok[:, None] & (ks < K)[None, :],
                        other=0.0,
                        eviction_policy="evict_first",
                    )
                    x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
                x, squares = norm_input(x, squares, norm_ptr, ks, ks < K, EVEN, NORM)
                if FORMAT == 1:
                    # One block scale for the whole sub-tile (clamped: a ragged tail's weights are masked).
                    x *= tl.load(s_row + tl.minimum((k0 + u * SUB) // GROUP, tl.cdiv(K, GROUP) - 1))
                acc2 += w.to(tl.float32) * x[None, :]
        acc = tl.sum(acc2, 1)[None, :]
    if SPLIT:
        mask = row_ok[:, None] & col_ok[None, :]
        parts = part_ptr + (rows.to(tl.int64)[:, None] * N + cols[None, :])
        tl.store(parts + pid_k * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial sums precede the counter's release
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")
        splits = tl.num_programs(1)
        if arrived == splits - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(0, splits):
                total += tl.load(parts + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(lock_ptr + pid_n, 0)  # ready for the next launch
            if NORM:
                row_sums = row_squares(x_ptr, K, 512)
            else:
                row_sums = squares
            _finish(
                total,
                row_sums,
                rows,
                cols,
                row_ok,
                col_ok,
                pid_n,
                N,
                K,
                eps,
                x_ptr,
                s_ptr,
                bias_ptr,
                res_ptr,
                out_ptr,
                FORMAT,
                HAS_BIAS,
                ROW_FUSED,
                NORM,
                RESIDUAL,
                GATED,
                BLOCK_N,
            )
    else:
        _finish(
            acc,
            squares,
            rows,
            cols,
            row_ok,
            col_ok,
            pid_n,
            N,
            K,
            eps,
            x_ptr,
            s_ptr,
            bias_ptr,
            res_ptr,
            out_ptr,
            FORMAT,
            HAS_BIAS,
            ROW_FUSED,
            NORM,
            RESIDUAL,
            GATED,
            BLOCK_N,
        )


@triton.jit
def _finish(
    acc,
    squares,
    rows,
    cols,
    row_ok,
    col_ok,
    pid_n,
    N,
    K,
    eps,
    x_ptr,
    s_ptr,
    bias_ptr,
    res_ptr,
    out_ptr,
    FORMAT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROW_FUSED: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Stores the whole reduction ``acc`` [BLOCK_M, BLOCK_N]: one fused row (kernels/row_fusion.py) or the
    plain outputs."""
    if ROW_FUSED:
        row_epilogue(
            tl.sum(acc, 0),
            squares,
            K,
            eps,
            pid_n,
            cols,
            col_ok,
            N,
            x_ptr,
            s_ptr,
            bias_ptr,
            res_ptr,
            out_ptr,
            HAS_SCALE=FORMAT == 0,
            HAS_BIAS=HAS_BIAS,
            NORM=NORM,
            RESIDUAL=RESIDUAL,
            GATED=GATED,
            BLOCK_N=BLOCK_N,
        )
    else:
        _epilogue(acc, rows, cols, row_ok, col_ok, s_ptr, bias_ptr, out_ptr, N, FORMAT, HAS_BIAS)


def prepare_device(device: torch.device) -> None:
    """Allocate ``device``'s zeroed split-K counters now, outside any CUDA graph capture."""
    if device not in _locks:
        _locks[device] = torch.zeros(_LOCKS, dtype=torch.int32, device=device)


def split_locks(device: torch.device, blocks: int) -> torch.Tensor | None:
    """The zeroed split-K counters of ``device``, or None when there are too few or none exist yet
    inside a CUDA graph capture (allocating them there would tie them to the graph's memory pool)."""
    if device not in _locks:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        prepare_device(device)
    return _locks[device] if blocks <= _LOCKS else None


def launch_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    fmt: int,
    group: int,
    config: QuantLinearConfig,
    *,
    dot_fp32: bool,
    fusion: RowFusion | None = None,
    row_tile: int = 1,
) -> torch.Tensor:
    """``[M, N]`` output for 1..MAX_GEMV_ROWS rows of ``x`` (validated by the caller; int4 ``weight`` in
    tiles of ``row_tile`` rows, 1 for the row layout: kernels/quant_reference.py); with ``fusion``
    one row of per-channel FP8 or int4 and the fused operands of kernels/row_fusion.py (validated too).
    A split reduction runs the fused epilogue in its last program, which sums the norm's squares over
    the whole row again."""
    block_n, block_k, split_k = config.block_n, config.block_k, config.split_k
    m = x.shape[0]
    use_dot = m > 1
    if use_dot and block_n < 16:
        raise ValueError(f"QuantLinearConfig.block_n: {m} rows run tl.dot, which needs >= 16, got {block_n}")
    features, out_dtype, grid_n = n, x.dtype, triton.cdiv(n, block_n)
    if fusion is not None:
        assert fmt in (FP8_CHANNEL, INT4_GROUPED) and m == 1, "row fusion runs one row of per-channel FP8 or int4"
        features, out_dtype = fusion.features, fusion.out_dtype
        block_n, grid_n = fusion.launch(block_n)
    out = torch.empty(m, features, dtype=out_dtype, device=x.device)
    # int4 and per-block FP8 walk sub-tiles that each lie inside one scale group.
    sub = block_k if fmt == FP8_CHANNEL else min(block_k, group)
    # Splits are whole steps (and whole groups for int4), so every split but the last is full.
    step = max(block_k, group) if fmt == INT4_GROUPED else block_k
    split_k = max(1, min(split_k, triton.cdiv(k, step)))
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), step) * step
    split_k = triton.cdiv(k, k_per_split)
    locks = split_locks(x.device, grid_n) if split_k > 1 else None
    if locks is None:
        split_k, k_per_split = 1, triton.cdiv(k, block_k) * block_k
    parts = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device) if split_k > 1 else out
    even = n % block_n == 0 and k % block_k == 0 and k_per_split % block_k == 0
    w = weight.view(torch.int32) if fmt == INT4_GROUPED else weight
    # The batch-1 decode chain (kernels/row_fusion.py). int4 launches plainly: on an H100 its 8B batch-1 step
    # took 4.51 ms as dependents and 3.94 ms without (benchmarks.quant_gpu, 2026-12-05; docs/kernels.md); its
    # many small programs (two warps, split reductions) run several waves, and dependents parked early on
    # the SMs likely take their places.
    one_row_pdl = m == 1 and fmt != INT4_GROUPED and pdl(x.device)
    norm_weight = None if fusion is None else fusion.norm_weight
    residual = None if fusion is None else fusion.residual
    _gemv_kernel[(grid_n, split_k)](
        x,
        w,
        scale,
        zeros,
        weight if bias is None else bias,
        out,
        parts,
        out if locks is None else locks,
        x if norm_weight is None else norm_weight,
        x if residual is None else residual,
        m,
        n,
        k,
        x.stride(0),
        k_per_split,
        0.0 if fusion is None else fusion.eps,
        FORMAT=fmt,
        GROUP=group,
        ROW_TILE=row_tile,
        HAS_BIAS=bias is not None,
        USE_DOT=use_dot,
        DOT_FP32=dot_fp32,
        SPLIT=split_k > 1,
        EVEN=even,
        SUB=sub,
        BLOCK_M=16 if use_dot else 1,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        STAGES=config.stages,
        ROW_FUSED=fusion is not None,
        NORM=norm_weight is not None,
        RESIDUAL=residual is not None,
        GATED=fusion is not None and fusion.gated,
        PDL=one_row_pdl,
        num_warps=config.num_warps,
        launch_pdl=one_row_pdl,
    )
    return out
