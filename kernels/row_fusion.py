"""What a one-row linear does around its product at batch-1 decode, so a decoder layer needs no
separate norm, residual-add or activation launch (each is a pass over one row that costs a launch
and a gap, about 2.5 us on Hopper, 97 of them per token in an 8B model):

- ``norm_weight``: the input is the un-normalized residual stream ``x``; the product runs over
  ``norm_weight * x`` and is scaled by ``rsqrt(mean(x^2) + eps)`` at the end (RMSNorm is a per-row
  scalar, so every program sums ``x^2`` over the reduction it walks anyway and needs no prologue);
- ``residual``: the output, rounded to the activation dtype, adds the residual row (the layer's
  o and down projections write the next residual stream directly);
- ``gated``: the weight stacks gate and up rows (``[2I, K]``); each program owns matching gate and
  up features and writes ``silu(gate) * up`` (``[1, I]``);
- ``out_dtype``: float32 logits straight from the LM head (rounded to the activation dtype first,
  as ``.float()`` of the unfused output would be).

On Hopper and later the one-row kernels launch with programmatic dependent launch (``pdl``): a kernel's
programs may be scheduled while the kernel before it drains, and wait for it (``griddepcontrol.wait``)
before they read or write anything; once past the wait each lets the next such kernel launch. At batch 1
the decoder's linears run back to back, so each one's launch and ramp overlap the previous one's tail.

Rounding follows the unfused kernels except for the norm, whose normalized input is never rounded
to the activation dtype: the fused product is the more precise one. ``kernels.reference.row_linear``
is the twin.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_dim, check_tensor, interpreting


@triton.jit
def dependent_launch_start(PDL: tl.constexpr):
    """First statement of a kernel launched with ``launch_pdl``: wait for the kernel before it to finish
    (its writes visible, its reads done), then let the kernel after it launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def pdl(device: torch.device) -> bool:
    """Whether one-row kernels on ``device`` launch as programmatic dependents (CUDA, compute capability 9+,
    not under the interpreter)."""
    return device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def norm_input(x, squares, norm_ptr, ks, k_ok, EVEN: tl.constexpr, NORM: tl.constexpr):
    """One step of the reduction's input (float32) under the fused norm: ``x`` times the norm weight, and
    ``squares`` gaining ``x^2`` for the row's scale (``row_epilogue``)."""
    if NORM:
        if EVEN:
            gamma = tl.load(norm_ptr + ks).to(tl.float32)
        else:
            gamma = tl.load(norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        squares += x * x
        x *= gamma
    return x, squares


@triton.jit
def row_squares(x_ptr, K, BLOCK: tl.constexpr):
    """``x^2`` summed over the whole row in ``BLOCK`` lanes: the norm's sums for the last program of a split
    reduction, whose own steps saw only its share of the row."""
    squares = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        squares += x * x
    return squares


@triton.jit
def row_columns(pid, N, GATED: tl.constexpr, BLOCK_N: tl.constexpr):
    """The weight rows a program reads and which of them exist. Gated: the first half of the block
    are gate rows ``f``, the second half the up rows ``I + f`` of the same features ``f``."""
    if GATED:
        r = tl.arange(0, BLOCK_N)
        feats = pid * (BLOCK_N // 2) + r % (BLOCK_N // 2)
        cols = feats + (r // (BLOCK_N // 2)) * (N // 2)
        col_ok = feats < N // 2
    else:
        cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
    return cols, col_ok


@triton.jit
def row_epilogue(
    acc,
    squares,
    K,
    eps,
    pid,
    cols,
    col_ok,
    N,
    x_ptr,
    scale_ptr,
    bias_ptr,
    res_ptr,
    out_ptr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Stores one program's outputs from ``acc`` (float32 ``[BLOCK_N]``, the product over its rows) and, under
    the fused norm, ``squares`` (``norm_input``'s sums over the ``K`` input features)."""
    act = x_ptr.dtype.element_ty
    out = acc
    if NORM:
        out *= tl.rsqrt(tl.sum(squares, 0) / K + eps)
    if HAS_SCALE:
        out *= tl.load(scale_ptr + cols, mask=col_ok, other=0.0)
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    out = out.to(act).to(tl.float32)
    if RESIDUAL:
        out = (out + tl.load(res_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)).to(act).to(tl.float32)
    if GATED:
        gate, up = tl.split(tl.trans(tl.reshape(out, (2, BLOCK_N // 2))))
        feats = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        out = (gate / (1.0 + tl.exp(-gate)) * up).to(act)
        tl.store(out_ptr + feats, out.to(out_ptr.dtype.element_ty), mask=feats < N // 2)
    else:
        tl.store(out_ptr + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


@dataclass(frozen=True, slots=True)
class RowFusion:
    """The validated fused operands of one call: see the module docstring. ``features`` and
    ``out_dtype`` describe the output row."""

    norm_weight: torch.Tensor | None
    eps: float
    residual: torch.Tensor | None
    gated: bool
    features: int
    out_dtype: torch.dtype

    @classmethod
    def of(
        cls,
        x: torch.Tensor,
        n: int,
        k: int,
        *,
        norm_weight: torch.Tensor | None,
        eps: float,
        residual: torch.Tensor | None,
        gated: bool,
        out_dtype: torch.dtype | None,
    ) -> RowFusion:
        """Checks the operands against ``x`` (``[1, k]``) and an ``[n, k]`` weight."""
        if x.shape[0] != 1:
            raise ValueError(f"x: a fused row linear takes one row, got shape {tuple(x.shape)}")
        if norm_weight is not None:
            check_tensor("norm_weight", norm_weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
            check_dim("norm_weight", norm_weight.shape[0], k, "in_features")
        if gated and n % 2:
            raise ValueError(f"gated: expected stacked gate and up rows (an even out_features), got {n}")
        if gated and residual is not None:
            raise ValueError("a gated row linear takes no residual: its output is the MLP's activation")
        features = n // 2 if gated else n
        if residual is not None:
            check_tensor("residual", residual, ndim=2, dtypes=(x.dtype,), device=x.device)
            if tuple(residual.shape) != (1, features):
                raise ValueError(f"residual: expected shape (1, {features}), got {tuple(residual.shape)}")
        dtype = out_dtype or x.dtype
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"out_dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
        return cls(norm_weight, float(eps), residual, gated, features, dtype)

    def launch(self, block_n: int) -> tuple[int, int]:
        """The weight rows per program and the number of programs for a config's ``block_n``: a gated
        program holds matching gate and up rows (at least two) and writes half as many outputs."""
        if not self.gated:
            return block_n, triton.cdiv(self.features, block_n)
        block_n = max(2, block_n)
        return block_n, triton.cdiv(self.features, block_n // 2)
