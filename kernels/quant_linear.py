"""Weight-only quantized linear layers: ``x @ dequantize(weight).T (+ bias)`` with FP8 (e4m3, per
output channel or per 128x128 block) or int4 (groups of 128 along K) weights and 16/32-bit
activations. Formats and their pure-torch twins: kernels/quant_reference.py.

Decode is memory-bound, so the kernels read the quantized bytes and de-quantize in registers:

- one row: each program owns ``block_n`` output features and accumulates elementwise products into a
  ``[block_n, block_k]`` tile, summed once at the end (the kernels/gemv.py walk over fewer bytes);
- 2..``max_dot_rows`` rows: the same walk with the de-quantized tile fed to ``tl.dot`` against a
  16+-row activation tile (the tensor cores are idle at this size anyway; the weight is read once per
  row block, not once per row);
- more rows (prefill chunks): the weight is de-quantized to the activation dtype once per call and
  cuBLAS runs the product. There the product is compute-bound and the one extra pass over the weight
  costs a few percent; ``torch._scaled_mm`` would also quantize the activations, which changes the
  numerics from weight-only, so it is not used.

Scales apply exactly: the tile handed to the multiply holds the raw fp8 value or ``q - zero`` (both
exact in bf16), and the group/block scale multiplies the tile's partial sums, per output feature.
Each ``block_k`` step lies inside one scale group, so a step reads one scale per feature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from omni_gateway.kernels.quant_reference import FP8_BLOCK, FP8_DTYPE, dequantize_fp8, dequantize_int4
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_dim, check_tensor, interpreting

FP8_CHANNEL = 0
FP8_BLOCKWISE = 1
INT4_GROUPED = 2


@dataclass(frozen=True)
class QuantLinearConfig:
    """Launch parameters. A loop step reads ``unroll`` tiles of ``block_n x block_k`` weights (each
    inside one scale group), with ``stages`` steps in flight. ``max_dot_rows``: above this many rows
    the weight is de-quantized and cuBLAS runs the product."""

    block_n: int = 16
    block_k: int = 128
    unroll: int = 2
    num_warps: int = 4
    stages: int = 3
    max_dot_rows: int = 256

    def __post_init__(self) -> None:
        for name, low in (("block_n", 1), ("block_k", 16), ("unroll", 1), ("num_warps", 1)):
            value = getattr(self, name)
            if value < low or value & (value - 1):
                raise ValueError(f"QuantLinearConfig.{name}: expected a power of two >= {low}, got {value}")
        if self.stages < 1:
            raise ValueError(f"QuantLinearConfig.stages: expected at least 1, got {self.stages}")
        if self.max_dot_rows < 1:
            raise ValueError(f"QuantLinearConfig.max_dot_rows: expected at least 1, got {self.max_dot_rows}")


def default_quant_config(rows: int, out_features: int, *, int4: bool = False) -> QuantLinearConfig:
    """Sized so a loop step reads about as many weight bytes as kernels/gemv.py's bf16 step (8 features
    x 512 elements x 2 bytes): 1024 FP8 or 2048 int4 elements per feature, in 128-element tiles (one
    scale group each). One row: 8-feature programs (4 below 2048 features, to fill the SMs). More rows:
    ``tl.dot`` needs 16+ features; 16 keeps 256 programs on a 4096-feature layer, and past 16 rows 64
    features per program re-read the weight over fewer row blocks."""
    unroll = 16 if int4 else 8
    if rows == 1:
        return QuantLinearConfig(block_n=8 if out_features >= 2048 else 4, block_k=128, unroll=unroll)
    if rows <= 16:
        return QuantLinearConfig(block_n=16, block_k=128, unroll=unroll // 2)
    return QuantLinearConfig(block_n=64, block_k=64, unroll=2, num_warps=4)


@triton.jit
def _weight_tile(
    w_ptr,
    s_ptr,
    z_ptr,
    cols,
    col_ok,
    k_start,
    K,
    EVEN: tl.constexpr,
    FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The ``[block_n, block_k]`` tile at ``k_start`` of unscaled weights (exact in bf16) and its
    per-feature scale (1 for per-channel FP8, whose scale applies to the finished sums)."""
    in_k = (cols * 0 + k_start) < K  # per feature: the interpreter rejects scalar masks
    # One return at the end: the branches are compile-time, and only the taken one is generated.
    if FORMAT == 2:
        half = k_start // 2 + tl.arange(0, BLOCK_K // 2)
        ptrs = w_ptr + cols.to(tl.int64)[:, None] * (K // 2) + half[None, :]
        g = cols * (K // GROUP) + k_start // GROUP
        if EVEN:
            packed = tl.load(ptrs, eviction_policy="evict_first")
            zero = tl.load(z_ptr + g).to(tl.float32)
            scale = tl.load(s_ptr + g).to(tl.float32)
        else:
            mask = col_ok[:, None] & (half < K // 2)[None, :]
            packed = tl.load(ptrs, mask=mask, other=0, eviction_policy="evict_first")
            zero = tl.load(z_ptr + g, mask=col_ok & in_k, other=0).to(tl.float32)
            scale = tl.load(s_ptr + g, mask=col_ok & in_k, other=0.0).to(tl.float32)
        w = tl.interleave(packed & 0xF, packed >> 4).to(tl.float32) - zero[:, None]
    else:
        ks = k_start + tl.arange(0, BLOCK_K)
        ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :]
        if EVEN:
            w = tl.load(ptrs, eviction_policy="evict_first").to(tl.float32)
        else:
            w = tl.load(ptrs, mask=col_ok[:, None] & (ks < K)[None, :], other=0.0, eviction_policy="evict_first")
            w = w.to(tl.float32)
        if FORMAT == 1:
            sp = s_ptr + (cols // GROUP) * tl.cdiv(K, GROUP) + k_start // GROUP
            if EVEN:
                scale = tl.load(sp)
            else:
                scale = tl.load(sp, mask=col_ok & in_k, other=0.0)
        else:
            scale = tl.full([BLOCK_N], 1.0, tl.float32)
    return w, scale


@triton.jit(do_not_specialize=["M"])
def _quant_linear_kernel(
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
    HAS_BIAS: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_FP32: tl.constexpr,
    EVEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UNROLL: tl.constexpr,
    STAGES: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K * UNROLL, num_stages=STAGES):
        for u in tl.static_range(UNROLL):
            k_start = k0 + u * BLOCK_K
            ks = k_start + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            w, scale = _weight_tile(
                w_ptr, s_ptr, z_ptr, cols, col_ok, k_start, K, EVEN, FORMAT, GROUP, BLOCK_N, BLOCK_K
            )
            if EVEN:
                x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None], other=0.0)
            else:
                x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if USE_DOT:
                if DOT_FP32:
                    part = tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
                else:
                    part = tl.dot(x, tl.trans(w.to(x.dtype)))
                if FORMAT == 0:
                    acc += part
                else:
                    acc += part * scale[None, :]
            else:
                xw = w * x.to(tl.float32)
                if FORMAT == 0:
                    acc += xw
                else:
                    acc += xw * scale[:, None]
    if USE_DOT:
        out = acc
    else:
        out = tl.sum(acc, 1)[None, :]
    if FORMAT == 0:
        out *= tl.load(s_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check_x(x: torch.Tensor, weight: torch.Tensor, k: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, device=weight.device, contiguous=False)
    check_dim("x", x.shape[1], k, "in_features")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
        check_dim("bias", bias.shape[0], n, "out_features")
    return x if x.stride(1) == 1 else x.contiguous()


def _launch(
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
) -> torch.Tensor:
    m = x.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    use_dot = m > 1
    if use_dot and config.block_n < 16:
        raise ValueError(f"QuantLinearConfig.block_n: {m} rows run tl.dot, which needs >= 16, got {config.block_n}")
    block_k = min(config.block_k, group) if fmt != FP8_CHANNEL else config.block_k
    block_m = 1 if not use_dot else max(16, min(64, triton.next_power_of_2(m)))
    even = n % config.block_n == 0 and k % (block_k * config.unroll) == 0
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, block_m))
    _quant_linear_kernel[grid](
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
        HAS_BIAS=bias is not None,
        USE_DOT=use_dot,
        # float32 activations multiply in full precision; the interpreter's bf16 dot is wrong.
        DOT_FP32=x.dtype == torch.float32 or interpreting(),
        EVEN=even,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=block_k,
        UNROLL=config.unroll,
        STAGES=config.stages,
        num_warps=config.num_warps,
    )
    return out


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: QuantLinearConfig | None = None,
) -> torch.Tensor:
    """``x @ dequantize_fp8(weight, scale).T (+ bias)`` for x ``[M, K]``, weight float8_e4m3fn ``[N, K]``
    and scale float32 ``[N]`` (per channel) or ``[cdiv(N, 128), cdiv(K, 128)]`` (per block)."""
    check_tensor("weight", weight, ndim=2, dtypes=(FP8_DTYPE,))
    n, k = weight.shape
    if scale.dim() == 1:
        check_tensor("scale", scale, ndim=1, dtypes=(torch.float32,), device=weight.device)
        check_dim("scale", scale.shape[0], n, "out_features (per-channel scale)")
        fmt = FP8_CHANNEL
    else:
        check_tensor("scale", scale, ndim=2, dtypes=(torch.float32,), device=weight.device)
        expected = (triton.cdiv(n, FP8_BLOCK), triton.cdiv(k, FP8_BLOCK))
        if tuple(scale.shape) != expected:
            raise ValueError(
                f"scale: expected per-block shape {expected} for weight {tuple(weight.shape)}, got {tuple(scale.shape)}"
            )
        fmt = FP8_BLOCKWISE
    x = _check_x(x, weight, k, n, bias)
    config = config or default_quant_config(x.shape[0], n)
    if x.shape[0] > config.max_dot_rows:
        return F.linear(x, dequantize_fp8(weight, scale, x.dtype), bias)
    return _launch(x, weight, scale, scale, bias, n, k, fmt, FP8_BLOCK, config)


def int4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: QuantLinearConfig | None = None,
) -> torch.Tensor:
    """``x @ dequantize_int4(packed, scales, zeros).T (+ bias)`` for x ``[M, K]``, packed uint8
    ``[N, K / 2]``, scales ``[N, K / G]`` (any float dtype) and zeros uint8 ``[N, K / G]``; G is a
    power of two of at least 16 (128 in AWQ/GPTQ checkpoints)."""
    check_tensor("packed", packed, ndim=2, dtypes=(torch.uint8,))
    n, k = packed.shape[0], packed.shape[1] * 2
    check_tensor("scales", scales, ndim=2, dtypes=FLOAT_DTYPES, device=packed.device)
    check_tensor("zeros", zeros, ndim=2, dtypes=(torch.uint8,), device=packed.device)
    if scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        raise ValueError(f"scales: expected [{n}, K / group] for K = {k}, got {tuple(scales.shape)}")
    if zeros.shape != scales.shape:
        raise ValueError(f"zeros: expected the shape of scales {tuple(scales.shape)}, got {tuple(zeros.shape)}")
    group = k // scales.shape[1]
    if group < 16 or group & (group - 1):
        raise ValueError(f"int4_linear: group size must be a power of two >= 16, got {group}")
    x = _check_x(x, packed, k, n, bias)
    config = config or default_quant_config(x.shape[0], n, int4=True)
    if x.shape[0] > config.max_dot_rows:
        return F.linear(x, dequantize_int4(packed, scales, zeros, x.dtype), bias)
    return _launch(x, packed, scales, zeros, bias, n, k, INT4_GROUPED, group, config)
