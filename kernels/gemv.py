"""Triton linear layer for one row: ``x @ weight.T (+ bias)`` (same signature as
``kernels.reference.linear``); more rows go to cuBLAS. ``row_linear`` is the same kernel with the
batch-1 decode fusions of kernels/row_fusion.py.

At batch 1 a linear layer streams its weight once and does two FLOPs per weight element, so all
that matters is how many weight bytes are in flight. Each program owns ``block_n`` output features
and walks the whole reduction in ``block_k`` steps, with ``stages`` loads in flight ahead of its
FMAs. There is no split-K: on the H200 sweep of ``benchmarks/gemv.py`` no split beat the plain
walk on any decode shape, and without it there is no separate reduction launch, which is where
cuBLAS loses most on the smaller matrices (its split-K kernels plus their reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from omni_gateway.kernels.row_fusion import (
    RowFusion,
    dependent_launch_start,
    norm_input,
    pdl,
    row_columns,
    row_epilogue,
)
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_dim, check_same_dtype, check_tensor


@dataclass(frozen=True)
class GemvConfig:
    """Launch parameters: output features per program, reduction elements per load, and the number
    of loads a program keeps in flight (Triton's software pipelining of the reduction loop)."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4
    stages: int = 3

    def __post_init__(self) -> None:
        for name, low in (("block_n", 1), ("block_k", 16), ("num_warps", 1)):
            value = getattr(self, name)
            if value < low or value & (value - 1):
                raise ValueError(f"GemvConfig.{name}: expected a power of two >= {low}, got {value}")
        if self.stages < 1:
            raise ValueError(f"GemvConfig.stages: expected at least 1, got {self.stages}")


def default_gemv_config(out_features: int) -> GemvConfig:
    """Below 2048 output features, 8-feature programs would be too few to fill the SMs (a 0.5B
    model's 896-feature down projection launches 112 of them on 132 SMs), so programs take 4
    features and longer loads. Measured on the H200 (docs/benchmarks.md, "One-row linear layers")."""
    if out_features < 2048:
        return GemvConfig(block_n=4, block_k=1024)
    return GemvConfig(block_n=8, block_k=512)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    norm_ptr,
    res_ptr,
    out_ptr,
    N,
    K,
    eps,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    EVEN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    dependent_launch_start(PDL)
    pid = tl.program_id(0)
    cols, col_ok = row_columns(pid, N, GATED, BLOCK_N)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
    # Elementwise FMAs into a [block_n, block_k] accumulator, summed once at the end: the loop holds
    # loads and FMAs only, no cross-lane reduction.
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    squares = tl.zeros([BLOCK_K], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        if EVEN:
            w = tl.load(w_rows + ks[None, :], eviction_policy="evict_first")
            x = tl.load(x_ptr + ks).to(tl.float32)
        else:
            w = tl.load(
                w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first"
            )
            x = tl.load(x_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        x, squares = norm_input(x, squares, norm_ptr, ks, k_ok, EVEN, NORM)
        acc += w.to(tl.float32) * x[None, :]
    row_epilogue(
        tl.sum(acc, 1),
        squares,
        K,
        eps,
        pid,
        cols,
        col_ok,
        N,
        x_ptr,
        bias_ptr,
        bias_ptr,
        res_ptr,
        out_ptr,
        HAS_SCALE=False,
        HAS_BIAS=HAS_BIAS,
        NORM=NORM,
        RESIDUAL=RESIDUAL,
        GATED=GATED,
        BLOCK_N=BLOCK_N,
    )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, config: GemvConfig | None = None
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for x ``[M, K]`` and weight ``[N, K]``: one row runs the Triton
    kernel, more rows ``F.linear`` (which checks its own arguments). Returns ``[M, N]`` in x's dtype."""
    if x.dim() == 2 and x.shape[0] != 1:
        return F.linear(x, weight, bias)
    return row_linear(x, weight, bias, config=config)


def row_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out_dtype: torch.dtype | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """One row of ``x @ weight.T (+ bias)`` with the fusions of kernels/row_fusion.py: x ``[1, K]``,
    weight ``[N, K]``; returns ``[1, N]`` (``[1, N / 2]`` gated) in ``out_dtype`` (default x's)."""
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, device=weight.device, contiguous=False)
    check_same_dtype(weight.dtype, x=x)
    n, k = weight.shape
    check_dim("x", x.shape[1], k, "in_features (weight.shape[1])")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
        check_dim("bias", bias.shape[0], n, "out_features (weight.shape[0])")
    fusion = RowFusion.of(
        x, n, k, norm_weight=norm_weight, eps=eps, residual=residual, gated=gated, out_dtype=out_dtype
    )
    if x.stride(1) != 1:
        x = x.contiguous()
    config = config or default_gemv_config(n)
    block_n, programs = fusion.launch(config.block_n)
    out = torch.empty(1, fusion.features, dtype=fusion.out_dtype, device=x.device)
    even = n % block_n == 0 and k % config.block_k == 0
    dependent = pdl(x.device)  # the batch-1 decode chain (kernels/row_fusion.py)
    _gemv_kernel[(programs,)](
        x,
        weight,
        weight if bias is None else bias,
        x if norm_weight is None else norm_weight,
        x if residual is None else residual,
        out,
        n,
        k,
        eps,
        HAS_BIAS=bias is not None,
        NORM=norm_weight is not None,
        RESIDUAL=residual is not None,
        GATED=gated,
        EVEN=even,
        BLOCK_N=block_n,
        BLOCK_K=config.block_k,
        STAGES=config.stages,
        PDL=dependent,
        num_warps=config.num_warps,
        launch_pdl=dependent,
    )
    return out
