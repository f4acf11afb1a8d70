"""Triton RMSNorm and fused residual-add + RMSNorm (same signatures as ``kernels.reference``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_dim, check_same_dtype, check_tensor, next_pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    new_res_ptr,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < HIDDEN
    off = row * HIDDEN + cols
    x = tl.load(x_ptr + off, mask=ok, other=0.0)
    if ADD_RESIDUAL:
        # The sum is rounded to the activation dtype first: the stored residual is what the
        # next layer adds to, and the norm must see the same values.
        res = tl.load(res_ptr + off, mask=ok, other=0.0)
        x = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + off, x, mask=ok)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / HIDDEN + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + off, (xf * inv_rms * w).to(out_ptr.dtype.element_ty), mask=ok)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
    check_dim("weight", weight.shape[0], x.shape[1], "hidden size (x.shape[1])")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` ``[T, H]`` over H, computed in fp32 and cast back to ``x.dtype``."""
    _check(x, weight)
    out = torch.empty_like(x)
    if x.shape[0]:
        hidden = x.shape[1]
        _rms_norm_kernel[(x.shape[0],)](
            x,
            x,
            weight,
            out,
            out,
            eps,
            HIDDEN=hidden,
            BLOCK=next_pow2(hidden),
            ADD_RESIDUAL=False,
            num_warps=_warps(hidden),
        )
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``new_residual = x + residual``; returns ``(rms_norm(new_residual), new_residual)``."""
    _check(x, weight)
    check_tensor("residual", residual, ndim=2, dtypes=FLOAT_DTYPES, device=x.device)
    check_same_dtype(x.dtype, residual=residual)
    if residual.shape != x.shape:
        raise ValueError(f"residual: expected the shape of x {tuple(x.shape)}, got {tuple(residual.shape)}")
    out = torch.empty_like(x)
    new_residual = torch.empty_like(x)
    if x.shape[0]:
        hidden = x.shape[1]
        _rms_norm_kernel[(x.shape[0],)](
            x,
            residual,
            weight,
            out,
            new_residual,
            eps,
            HIDDEN=hidden,
            BLOCK=next_pow2(hidden),
            ADD_RESIDUAL=True,
            num_warps=_warps(hidden),
        )
    return out, new_residual


def _warps(hidden: int) -> int:
    return max(1, min(16, next_pow2(hidden) // 512))
