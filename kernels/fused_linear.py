"""Triton linear layer for a few rows with the neighbouring elementwise work folded in (same
signature as ``kernels.reference``).

At decode batch sizes a linear layer only streams its weight matrix; the RMSNorm before it, the
SiLU-and-mul before the down projection and the residual add after it are tiny kernels whose
launch gaps cost more than their work. Here each program owns ``block_n`` output columns, walks
the whole reduction dimension once and applies, on the fly:

- prologue ``norm``: ``rms_norm(x) * norm_weight``. The sum of squares of a row is accumulated in
  the same loop and its reciprocal root scales the finished dot products (a per-row factor
  commutes with the matmul), so the weights stream without waiting for a first pass over ``x``.
- prologue ``silu_mul``: ``silu(x[:, :K]) * x[:, K:]`` for a merged gate/up activation.
- epilogue: ``+ bias``, then ``+ residual``.

Up to ``MAX_ROWS`` rows share every weight load.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.validation import FLOAT_DTYPES, check_dim, check_same_dtype, check_tensor

MAX_ROWS = 16

_PLAIN, _NORM, _SILU_MUL = 0, 1, 2


@dataclass(frozen=True)
class LinearConfig:
    """Launch parameters of the fused linear kernel."""

    block_n: int = 8  # output columns per program
    block_k: int = 512  # reduction elements per loop step
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name, low in (("block_n", 1), ("block_k", 16)):
            value = getattr(self, name)
            if value < low or value & (value - 1):
                raise ValueError(f"LinearConfig.{name}: expected a power of two >= {low}, got {value}")


def default_linear_config(weight: torch.Tensor, rows: int) -> LinearConfig:
    """Enough programs per SM to keep several weight tiles in flight; the per-thread products
    (rows x block_n x block_k / threads) stay at about 32 registers."""
    if weight.device.type != "cuda":
        return LinearConfig(block_n=4, block_k=32, num_warps=4, num_stages=1)
    block_m = _block_m(rows)
    block_k = max(64, 512 // block_m)
    return LinearConfig(block_n=8, block_k=block_k)


def _block_m(rows: int) -> int:
    return 1 if rows <= 1 else 1 << (rows - 1).bit_length()


@triton.jit
def _fused_linear_kernel(
    x_ptr, w_ptr, bias_ptr, norm_w_ptr, res_ptr, out_ptr,
    M, N, K, stride_x, stride_res, stride_out, eps,
    PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # A matrix-vector product per row, not a tensor-core tile: at these sizes the kernel only
    # streams weights, and plain FMAs into a [rows, block_n, block_k] accumulator (summed once at
    # the end) keep each program small, so many programs per SM keep many loads in flight.
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    sum_sq = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x_mask = row_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_rows + ks[None, :], mask=x_mask, other=0.0).to(tl.float32)
        if PROLOGUE == 1:
            sum_sq += x * x
            x = x * tl.load(norm_w_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        if PROLOGUE == 2:
            up = tl.load(x_rows + K + ks[None, :], mask=x_mask, other=0.0).to(tl.float32)
            x = x / (1.0 + tl.exp(-x)) * up
        acc += w[None, :, :] * x[:, None, :]
    out = tl.sum(acc, 2)
    if PROLOGUE == 1:
        out = out * tl.rsqrt(tl.sum(sum_sq, 1) / K + eps)[:, None]
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_mask = row_ok[:, None] & col_ok[None, :]
    if HAS_RESIDUAL:
        res_off = rows.to(tl.int64)[:, None] * stride_res + cols[None, :]
        out += tl.load(res_ptr + res_off, mask=out_mask, other=0.0).to(tl.float32)
    out_off = rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=out_mask)


def fused_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
    residual: torch.Tensor | None = None,
    config: LinearConfig | None = None,
) -> torch.Tensor:
    """``prologue(x) @ weight.T (+ bias) (+ residual)`` for ``x`` of at most ``MAX_ROWS`` rows.

    ``weight`` is ``[N, K]``. The prologue is ``rms_norm(x, norm_weight, eps)`` when
    ``norm_weight`` is given (x ``[M, K]``), ``silu(x[:, :K]) * x[:, K:]`` when ``silu_mul``
    (x ``[M, 2K]``), else ``x`` itself. ``residual`` ``[M, N]`` is added last. Returns ``[M, N]``
    in x's dtype.
    """
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, device=weight.device, contiguous=False)
    check_same_dtype(weight.dtype, x=x)
    if x.stride(1) != 1:
        raise ValueError(f"x: expected contiguous rows, got strides {x.stride()} for shape {tuple(x.shape)}")
    rows, (n, k) = x.shape[0], weight.shape
    if rows > MAX_ROWS:
        raise ValueError(f"x: expected at most {MAX_ROWS} rows, got {rows}")
    if norm_weight is not None and silu_mul:
        raise ValueError("fused_linear: expected one prologue, got both norm_weight and silu_mul")
    check_dim("x", x.shape[1], 2 * k if silu_mul else k,
              "2 x in_features (2 * weight.shape[1])" if silu_mul else "in_features (weight.shape[1])")
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
        check_dim("norm_weight", norm_weight.shape[0], k, "in_features (weight.shape[1])")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
        check_dim("bias", bias.shape[0], n, "out_features (weight.shape[0])")
    if residual is not None:
        check_tensor("residual", residual, ndim=2, dtypes=FLOAT_DTYPES, device=x.device, contiguous=False)
        if residual.shape != (rows, n) or residual.stride(1) != 1:
            raise ValueError(f"residual: expected shape ({rows}, {n}) with contiguous rows, got shape "
                             f"{tuple(residual.shape)} with strides {residual.stride()}")
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    config = config or default_linear_config(weight, rows)
    prologue = _NORM if norm_weight is not None else _SILU_MUL if silu_mul else _PLAIN
    _fused_linear_kernel[(triton.cdiv(n, config.block_n),)](
        x, weight, weight if bias is None else bias, weight if norm_weight is None else norm_weight,
        out if residual is None else residual, out,
        rows, n, k, x.stride(0), 0 if residual is None else residual.stride(0), out.stride(0), eps,
        PROLOGUE=prologue, HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
        BLOCK_M=_block_m(rows), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
