"""Triton SiLU-and-multiply for gated MLPs (same signature as ``kernels.reference``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_tensor

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, INTER: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < INTER
    gate = tl.load(x_ptr + row * 2 * INTER + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * INTER + INTER + cols, mask=ok, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * INTER + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x`` of shape ``[T, 2I]`` -> ``[T, I]``."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    if x.shape[1] % 2:
        raise ValueError(f"x: expected an even last dimension [T, 2I], got shape {tuple(x.shape)}")
    inter = x.shape[1] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    if x.shape[0] and inter:
        block = min(_BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(x.shape[0], triton.cdiv(inter, block))](x, out, INTER=inter, BLOCK=block)
    return out
