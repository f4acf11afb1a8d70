"""Prefill-sized weight-only quantized linears (more than ``MAX_GEMV_ROWS`` rows). FP8 per channel runs
on the FP8 tensor cores through ``torch._scaled_mm``; the other formats either de-quantize weight tiles
inside a Triton GEMM or, for many rows, de-quantize the whole weight in one pass into a scratch buffer
that cuBLAS multiplies (measured on the H200: the Triton GEMM runs at 0.3-0.55x of cuBLAS bf16 at 1024+
rows, where one extra pass over the weight costs a few percent; it wins only at a few dozen rows).

- ``dequant_gemm``: ``[block_m, block_k] x [block_k, block_n]`` tiles with the weight tile de-quantized
  in registers to the activation dtype (``(q - zero) * scale`` for int4, ``fp8 * block scale`` for
  per-block FP8; per-channel FP8 scales the finished sums). Programs walk the output in groups of
  ``GROUP_M`` row blocks so that a weight tile is reused from L2.
- ``dequant_linear``: ``_dequant_kernel`` writes the weight in the activation dtype (the caching
  allocator hands the same block back on the next call), then ``F.linear``.
- ``fp8_scaled_mm``: W8A8 with dynamic per-token activation scales (one Triton pass quantizes the
  activations, ``amax / 448`` per row) and the weight's per-channel scales, bf16 out: vLLM's FP8
  scheme. Its numerics differ from weight-only by the activations' rounding to e4m3 (a relative
  error of at most 2^-4 per element); the twin is ``quant_reference.fp8_linear_dynamic``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from omni_gateway.kernels.quant_reference import FP8_DTYPE, FP8_MAX
from omni_gateway.kernels.quant_tiles import int4_k_offset, int4_row_start

GROUP_M = tl.constexpr(8)  # row blocks walked together, so weight tiles are reused from L2


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    stages: int = 3


def default_gemm_config(rows: int) -> GemmConfig:
    """64-row tiles up to 64 rows (one warpgroup), 128 above."""
    if rows <= 64:
        return GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=4, stages=4)
    return GemmConfig()


@triton.jit(do_not_specialize=["M"])
def _dequant_gemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
    ROW_TILE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    if FORMAT == 2:
        w_rows = w_ptr + int4_row_start(cols, K, GROUP, ROW_TILE, 2)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        if EVEN_K:
            x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None], other=0.0)
        else:
            x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP32:
            x = x.to(tl.float32)
        in_k = (cols * 0 + k0) < K  # per feature: the interpreter rejects scalar masks
        if FORMAT == 2:
            # BLOCK_K divides the group (both powers of two), so the tile's bytes lie in one group.
            half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            packed = tl.load(
                w_rows + (int4_k_offset(k0, GROUP, ROW_TILE, 2) + tl.arange(0, BLOCK_K // 2))[None, :],
                mask=col_ok[:, None] & (half < K // 2)[None, :],
                other=0,
            )
            g = cols * (K // GROUP) + k0 // GROUP
            zero = tl.load(z_ptr + g, mask=col_ok & in_k, other=0).to(tl.float32)
            scale = tl.load(s_ptr + g, mask=col_ok & in_k, other=0.0).to(tl.float32)
            q = tl.interleave(packed & 0xF, packed >> 4).to(tl.int32) | 0x4B000000
            w = ((q.to(tl.float32, bitcast=True) - (8388608.0 + zero[:, None])) * scale[:, None]).to(x.dtype)
        else:
            w = tl.load(
                w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0
            )
            if FORMAT == 1:
                # block_n divides 128 and block_k divides 128: one block scale for the whole tile.
                block_scale = tl.load(s_ptr + (pid_n * BLOCK_N // GROUP) * tl.cdiv(K, GROUP) + k0 // GROUP)
                w = (w.to(tl.float32) * block_scale).to(x.dtype)
            else:
                w = w.to(x.dtype)
        if DOT_FP32:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if FORMAT == 0:
        acc *= tl.load(s_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def dequant_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    fmt: int,
    group: int,
    *,
    config: GemmConfig | None = None,
    dot_fp32: bool,
    row_tile: int = 1,
) -> torch.Tensor:
    """``[M, N]`` for any number of rows (arguments validated by the caller; int4 ``weight`` in tiles of
    ``row_tile`` rows, 1 for the row layout). Per-block FP8 and int4 need ``block_k`` (and per-block FP8
    ``block_n``) to divide the group (all powers of two); the tile shrinks to fit."""
    m = x.shape[0]
    config = config or default_gemm_config(m)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_k, block_n = config.block_k, config.block_n
    if fmt != 0:
        block_k = min(block_k, group)
    if fmt == 1:
        block_n = min(block_n, group)
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, block_n),)
    _dequant_gemm_kernel[grid](
        x,
        weight,
        scale,
        zeros,
        weight if bias is None else bias,
        out,
        m,
        n,
        k,
        x.stride(0),
        FORMAT=fmt,
        GROUP=group,
        ROW_TILE=row_tile,
        HAS_BIAS=bias is not None,
        DOT_FP32=dot_fp32,
        EVEN_K=k % block_k == 0,
        BLOCK_M=config.block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        STAGES=config.stages,
        num_warps=config.num_warps,
    )
    return out


@triton.jit
def _dequant_kernel(
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    K,
    FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
    ROW_TILE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One ``[BLOCK_N, BLOCK_K]`` tile of the de-quantized weight, written row-major whatever the int4
    layout; the tile lies in one scale group."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    ks = k0 + tl.arange(0, BLOCK_K)
    row_ok = rows < N
    ok = row_ok[:, None] & (ks < K)[None, :]
    if FORMAT == 2:
        half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        k_part = int4_k_offset(k0, GROUP, ROW_TILE, 2) + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(
            w_ptr + int4_row_start(rows, K, GROUP, ROW_TILE, 2)[:, None] + k_part[None, :],
            mask=row_ok[:, None] & (half < K // 2)[None, :],
            other=0,
        )
        g = rows * (K // GROUP) + k0 // GROUP
        zero = tl.load(z_ptr + g, mask=row_ok, other=0).to(tl.float32)
        scale = tl.load(s_ptr + g, mask=row_ok, other=0.0).to(tl.float32)
        q = tl.interleave(packed & 0xF, packed >> 4).to(tl.int32) | 0x4B000000
        w = (q.to(tl.float32, bitcast=True) - (8388608.0 + zero[:, None])) * scale[:, None]
    else:
        w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :], mask=ok, other=0.0).to(tl.float32)
        if FORMAT == 1:
            w *= tl.load(s_ptr + (tl.program_id(0) * BLOCK_N // GROUP) * tl.cdiv(K, GROUP) + k0 // GROUP)
        else:
            w *= tl.load(s_ptr + rows, mask=row_ok, other=0.0)[:, None]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :], w.to(out_ptr.dtype.element_ty), mask=ok)


def dequant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    fmt: int,
    group: int,
    *,
    row_tile: int = 1,
) -> torch.Tensor:
    """De-quantize into a scratch row-major ``[N, K]`` weight in x's dtype (one pass; int4 ``weight`` in
    tiles of ``row_tile`` rows, 1 for the row layout), then ``F.linear``."""
    full = torch.empty(n, k, dtype=x.dtype, device=x.device)
    block_n, block_k = 32, min(128, group)  # powers of two: block_k divides the group
    _dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        weight,
        scale,
        zeros,
        full,
        n,
        k,
        FORMAT=fmt,
        GROUP=group,
        ROW_TILE=row_tile,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
    )
    return F.linear(x, full, bias)


@triton.jit(do_not_specialize=["M"])
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_xm, BLOCK_K: tl.constexpr):
    """One program per row: ``s = max|x| / 448`` and ``q = x / s`` in e4m3 (two passes over the row,
    the second from L2)."""
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xm
    amax = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        amax = tl.maximum(amax, tl.abs(tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)))
    scale = tl.maximum(tl.max(amax, 0) / 448.0, 1e-12)
    tl.store(s_ptr + row, scale)
    q_row = q_ptr + row.to(tl.int64) * K
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
        tl.store(q_row + ks, q.to(q_ptr.dtype.element_ty), mask=ks < K)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: e4m3 ``[M, K]`` and float32 ``[M, 1]`` with ``x ~ q * scale`` per row
    (``quant_reference.quantize_fp8_per_token``)."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        _quant_rows_kernel[(m,)](
            x, q, scale, m, k, x.stride(0), BLOCK_K=min(4096, triton.next_power_of_2(k)), num_warps=8
        )
    return q, scale


def scaled_mm_supported(x: torch.Tensor, n: int, k: int) -> bool:
    """``torch._scaled_mm`` rowwise: bf16 activations on a CUDA device with FP8 tensor cores (sm_89+),
    K and N multiples of 16."""
    return (
        x.device.type == "cuda"
        and x.dtype == torch.bfloat16
        and n % 16 == 0
        and k % 16 == 0
        and torch.cuda.get_device_capability(x.device) >= (8, 9)
    )


def fp8_scaled_mm(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ (weight * scale[:, None]).T (+ bias)`` with the activations quantized per token (W8A8)."""
    assert FP8_MAX == 448.0  # the Triton pass hard-codes e4m3's largest value
    q, x_scale = quantize_rows_fp8(x)
    out = torch._scaled_mm(q, weight.t(), scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=x.dtype)
    return out if bias is None else out.add_(bias)
