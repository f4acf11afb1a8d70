"""Triton linear layer for one row: ``x @ weight.T (+ bias)`` (same signature as
``kernels.reference.linear``); more rows go to cuBLAS.

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
    out_ptr,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    EVEN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
    # Elementwise FMAs into a [block_n, block_k] accumulator, summed once at the end: the loop holds
    # loads and FMAs only, no cross-lane reduction.
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(w_rows + ks[None, :], eviction_policy="evict_first")
            x = tl.load(x_ptr + ks)
        else:
            k_ok = ks < K
            w = tl.load(
                w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first"
            )
            x = tl.load(x_ptr + ks, mask=k_ok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    out = tl.sum(acc, 1)
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, config: GemvConfig | None = None
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for x ``[M, K]`` and weight ``[N, K]``: one row runs the Triton
    kernel, more rows ``F.linear`` (which checks its own arguments). Returns ``[M, N]`` in x's dtype."""
    if x.dim() == 2 and x.shape[0] != 1:
        return F.linear(x, weight, bias)
    check_tensor("weight", weight, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, device=weight.device, contiguous=False)
    check_same_dtype(weight.dtype, x=x)
    n, k = weight.shape
    check_dim("x", x.shape[1], k, "in_features (weight.shape[1])")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
        check_dim("bias", bias.shape[0], n, "out_features (weight.shape[0])")
    if x.stride(1) != 1:
        x = x.contiguous()
    config = config or default_gemv_config(n)
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    even = n % config.block_n == 0 and k % config.block_k == 0
    _gemv_kernel[(triton.cdiv(n, config.block_n),)](
        x,
        weight,
        weight if bias is None else bias,
        out,
        n,
        k,
        HAS_BIAS=bias is not None,
        EVEN=even,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        STAGES=config.stages,
        num_warps=config.num_warps,
    )
    return out
