"""Weight-only quantized linear layers: ``x @ dequantize(weight).T (+ bias)`` with FP8 (e4m3, per
output channel or per 128x128 block) or int4 (groups along K, AWQ/GPTQ) weights and 16/32-bit
activations. Formats and their pure-torch twins: kernels/quant_reference.py.

Up to ``QuantLinearConfig.max_dot_rows`` rows (decode) run the memory-bound kernel of
kernels/quant_gemv.py with a launch config from kernels/quant_tuning.py (one bfloat16 row of tiled int4
in groups of 128: the tensor-core kernel of kernels/int4_fragments.py); more rows (prefill) run
kernels/quant_gemm.py: FP8 per channel with bf16 activations on the FP8 tensor cores
(``torch._scaled_mm``, activations quantized per token); everything else through the Triton GEMM that
de-quantizes weight tiles in registers up to ``DEQUANT_GEMM_MAX_ROWS`` rows (or whenever a
``gemm_config`` is given), and above that through one de-quantize pass and cuBLAS.
"""

from __future__ import annotations

import torch
from omni_gateway.kernels import int4_fragments
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite
from omni_gateway.kernels.int4_row_stream import GateSums, StreamRow
from omni_gateway.kernels.quant_gemm import (
    GemmConfig,
    dequant_gemm,
    dequant_linear,
    fp8_scaled_mm,
    scaled_mm_supported,
)
from omni_gateway.kernels.quant_gemv import launch_gemv, prepare_device, split_locks
from omni_gateway.kernels.quant_reference import FP8_BLOCK, FP8_DTYPE, int4_layout
from omni_gateway.kernels.quant_tuning import FP8_BLOCKWISE, FP8_CHANNEL, INT4_GROUPED, QuantLinearConfig, tuned_config
from omni_gateway.kernels.rotary import rotary_write_kv
from omni_gateway.kernels.row_fusion import RowFusion
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_dim, check_tensor, interpreting

# Up to this many rows the Triton GEMM de-quantizes tiles in registers; above, one de-quantize pass and
# cuBLAS win (kernels/quant_gemm.py).
DEQUANT_GEMM_MAX_ROWS = 64

__all__ = [
    "GemmConfig",
    "QuantLinearConfig",
    "fp8_linear",
    "fp8_row_linear",
    "int4_linear",
    "int4_row_linear",
    "prepare_device",
]


def _check_x(x: torch.Tensor, weight: torch.Tensor, k: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, device=weight.device, contiguous=False)
    check_dim("x", x.shape[1], k, "in_features")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
        check_dim("bias", bias.shape[0], n, "out_features")
    return x if x.stride(1) == 1 else x.contiguous()


def _run(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    fmt: int,
    group: int,
    config: QuantLinearConfig | None,
    gemm_config: GemmConfig | None,
    row_tile: int = 1,
) -> torch.Tensor:
    m = x.shape[0]
    if m == 0:
        return torch.empty(0, n, dtype=x.dtype, device=x.device)
    # float32 activations multiply in full precision; the interpreter's bf16 dot is wrong.
    dot_fp32 = x.dtype == torch.float32 or interpreting()
    config = config or tuned_config(fmt, m, n, k)
    if m <= config.max_dot_rows:
        return launch_gemv(
            x, weight, scale, zeros, bias, n, k, fmt, group, config, dot_fp32=dot_fp32, row_tile=row_tile
        )
    if fmt == FP8_CHANNEL and config.scaled_mm and not interpreting() and scaled_mm_supported(x, n, k):
        return fp8_scaled_mm(x, weight, scale, bias)
    if gemm_config is None and m > DEQUANT_GEMM_MAX_ROWS:
        return dequant_linear(x, weight, scale, zeros, bias, n, k, fmt, group, row_tile=row_tile)
    return dequant_gemm(
        x, weight, scale, zeros, bias, n, k, fmt, group, config=gemm_config, dot_fp32=dot_fp32, row_tile=row_tile
    )


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: QuantLinearConfig | None = None,
    gemm_config: GemmConfig | None = None,
) -> torch.Tensor:
    """``x @ dequantize_fp8(weight, scale).T (+ bias)`` for x ``[M, K]``, weight float8_e4m3fn ``[N, K]``
    and scale float32 ``[N]`` (per channel) or ``[cdiv(N, 128), cdiv(K, 128)]`` (per block). Many bf16
    rows with per-channel scales quantize the activations too (``quant_reference.fp8_linear_dynamic``)."""
    check_tensor("weight", weight, ndim=2, dtypes=(FP8_DTYPE,))
    n, k = weight.shape
    if scale.dim() == 1:
        check_tensor("scale", scale, ndim=1, dtypes=(torch.float32,), device=weight.device)
        check_dim("scale", scale.shape[0], n, "out_features (per-channel scale)")
        fmt = FP8_CHANNEL
    else:
        check_tensor("scale", scale, ndim=2, dtypes=(torch.float32,), device=weight.device)
        expected = (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
        if tuple(scale.shape) != expected:
            raise ValueError(
                f"scale: expected per-block shape {expected} for weight {tuple(weight.shape)}, got {tuple(scale.shape)}"
            )
        fmt = FP8_BLOCKWISE
    x = _check_x(x, weight, k, n, bias)
    return _run(x, weight, scale, scale, bias, n, k, fmt, FP8_BLOCK, config, gemm_config)


def fp8_row_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out_dtype: torch.dtype | None = None,
    config: QuantLinearConfig | None = None,
) -> torch.Tensor:
    """One row of ``fp8_linear`` with per-channel scales and the batch-1 decode fusions of
    kernels/row_fusion.py; returns ``[1, N]`` (``[1, N / 2]`` gated) in ``out_dtype`` (default x's)."""
    check_tensor("weight", weight, ndim=2, dtypes=(FP8_DTYPE,))
    n, k = weight.shape
    if scale.dim() != 1:
        raise ValueError(f"scale: row fusion takes per-channel scales [{n}], got shape {tuple(scale.shape)}")
    check_tensor("scale", scale, ndim=1, dtypes=(torch.float32,), device=weight.device)
    check_dim("scale", scale.shape[0], n, "out_features (per-channel scale)")
    x = _check_x(x, weight, k, n, bias)
    fusion = RowFusion.of(
        x, n, k, norm_weight=norm_weight, eps=eps, residual=residual, gated=gated, out_dtype=out_dtype
    )
    config = config or tuned_config(FP8_CHANNEL, 1, n, k)
    return launch_gemv(
        x, weight, scale, scale, bias, n, k, FP8_CHANNEL, FP8_BLOCK, config, dot_fp32=False, fusion=fusion
    )


def _check_int4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[int, int, int, int]:
    """``(N, K, group, row tile)`` of a packed int4 weight in either layout (kernels/quant_reference.py;
    the row tile of the row layout is 1), its scales and zero points."""
    ndim = packed.dim() if isinstance(packed, torch.Tensor) else 2  # check_tensor names what a non-tensor is
    if ndim not in (2, 4):
        raise ValueError(
            f"packed: expected rows [N, K / 2] or row tiles [N / T, K / G, T, G / 2], got shape {tuple(packed.shape)}"
        )
    check_tensor("packed", packed, ndim=ndim, dtypes=(torch.uint8,))
    n, k, row_tile = int4_layout(packed)
    check_tensor("scales", scales, ndim=2, dtypes=FLOAT_DTYPES, device=packed.device)
    check_tensor("zeros", zeros, ndim=2, dtypes=(torch.uint8,), device=packed.device)
    if scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        raise ValueError(f"scales: expected [{n}, K / group] for K = {k}, got {tuple(scales.shape)}")
    if zeros.shape != scales.shape:
        raise ValueError(f"zeros: expected the shape of scales {tuple(scales.shape)}, got {tuple(zeros.shape)}")
    group = k // scales.shape[1]
    if group < 16 or group & (group - 1):
        raise ValueError(f"int4_linear: group size must be a power of two >= 16, got {group}")
    if ndim == 4 and packed.shape[3] * 2 != group:
        raise ValueError(
            f"packed: expected row tiles of {group // 2} bytes a row (the scales' group of {group}), got shape "
            f"{tuple(packed.shape)}"
        )
    return n, k, group, row_tile


def _int4_fragments(
    x: torch.Tensor | StreamRow | GateSums,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | StreamRow | GateSums,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    rotary: RotaryWrite | None = None,
) -> None:
    """One row on the tensor cores (``int4_fragments.supported``), split over the groups where the device's
    split-K counters allow. A ``rotary`` the epilogue cannot run (``RotaryWrite.fits``) runs after it."""
    n, block_n = scales.shape[0], int4_fragments.BLOCK_N
    after = rotary is not None and isinstance(out, torch.Tensor) and not rotary.fits(out.dtype, n, block_n)
    locks = split_locks(packed.device, n // block_n)
    int4_fragments.launch(
        x,
        packed,
        scales,
        zeros,
        bias,
        out,
        locks,
        norm_weight=norm_weight,
        eps=eps,
        residual=residual,
        gated=gated,
        rotary=None if after else rotary,
    )
    if after:
        assert isinstance(out, torch.Tensor) and rotary is not None
        _rotate_and_write(out, rotary)


def int4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    config: QuantLinearConfig | None = None,
    gemm_config: GemmConfig | None = None,
) -> torch.Tensor:
    """``x @ dequantize_int4(packed, scales, zeros).T (+ bias)`` for x ``[M, K]``, packed uint8
    ``[N, K / 2]`` (rows) or ``[N / T, K / G, T, G / 2]`` (row tiles), scales ``[N, K / G]`` (any float
    dtype) and zeros uint8 ``[N, K / G]``; G is a power of two of at least 16 (128 in AWQ/GPTQ
    checkpoints)."""
    n, k, group, row_tile = _check_int4(packed, scales, zeros)
    x = _check_x(x, packed, k, n, bias)
    if x.shape[0] == 1 and config is None and int4_fragments.supported(x, packed, group):
        out = torch.empty(1, n, dtype=x.dtype, device=x.device)
        _int4_fragments(x, packed, scales, zeros, bias, out)
        return out
    return _run(x, packed, scales, zeros, bias, n, k, INT4_GROUPED, group, config, gemm_config, row_tile)


def int4_row_linear(
    x: torch.Tensor | StreamRow | GateSums,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out_dtype: torch.dtype | None = None,
    config: QuantLinearConfig | None = None,
    rotary: RotaryWrite | None = None,
    into: StreamRow | GateSums | None = None,
) -> torch.Tensor | StreamRow | GateSums:
    """One row of ``int4_linear`` with the batch-1 decode fusions of kernels/row_fusion.py; returns
    ``[1, N]`` (``[1, N / 2]`` gated) in ``out_dtype`` (default x's). Tiled bfloat16 rows in groups of 128
    run on the tensor cores (kernels/int4_fragments.py) unless a ``config`` asks for the CUDA-core planes.
    With ``rotary`` (a qkv projection) the output's q heads come rotated and the token's k and v go to the
    caches (kernels/rotary.py ``rotary_write_kv``), in the epilogue where ``RotaryWrite.fits``.

    The float32 rows of kernels/int4_row_stream.py run on the tensor cores only: ``x`` the residual stream
    (``StreamRow``, normed by ``norm_weight``) or a gate/up projection's ``GateSums``, and ``into`` the stream
    (ungated, no norm) or zeroed ``GateSums`` (gated, normed) that the product is added into and which is
    returned, instead of a new row."""
    n, k, group, row_tile = _check_int4(packed, scales, zeros)
    if not isinstance(x, torch.Tensor) or into is not None:
        return _int4_stream(x, packed, scales, zeros, bias, n, k, group, norm_weight, eps, gated, out_dtype,
                            config, rotary, into)  # fmt: skip
    x = _check_x(x, packed, k, n, bias)
    fusion = RowFusion.of(
        x, n, k, norm_weight=norm_weight, eps=eps, residual=residual, gated=gated, out_dtype=out_dtype
    )
    if config is None and int4_fragments.supported(x, packed, group):
        out = torch.empty(1, fusion.features, dtype=fusion.out_dtype, device=x.device)
        _int4_fragments(x, packed, scales, zeros, bias, out, norm_weight, eps, residual, gated, rotary)
        return out
    config = config or tuned_config(INT4_GROUPED, 1, n, k)
    out = launch_gemv(
        x,
        packed,
        scales,
        zeros,
        bias,
        n,
        k,
        INT4_GROUPED,
        group,
        config,
        dot_fp32=False,
        fusion=fusion,
        row_tile=row_tile,
    )
    if rotary is not None:
        _rotate_and_write(out, rotary)
    return out


def _int4_stream(
    x: torch.Tensor | StreamRow | GateSums,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    k: int,
    group: int,
    norm_weight: torch.Tensor | None,
    eps: float,
    gated: bool,
    out_dtype: torch.dtype | None,
    config: QuantLinearConfig | None,
    rotary: RotaryWrite | None,
    into: StreamRow | GateSums | None,
) -> torch.Tensor | StreamRow | GateSums:
    """``int4_row_linear`` reading or adding into the float32 rows of kernels/int4_row_stream.py."""
    if config is not None or not int4_fragments.supported(x, packed, group):
        raise ValueError(
            "int4_row_linear: the float32 stream rows need the tensor-core kernel (kernels/int4_fragments.py): "
            f"sm_90+, groups of {int4_fragments.GROUP}, words in {int4_fragments.ROW_TILE}-row tiles and no "
            f"launch config; got groups of {group}, packed {tuple(packed.shape)}, config {config}"
        )
    f32 = (torch.float32,)
    if isinstance(x, GateSums):
        check_tensor("x.sums", x.sums, ndim=2, dtypes=f32, device=packed.device)
        check_dim("x.sums", x.sums.shape[1], 2 * k, "twice in_features (gate then up)")
        check_tensor("x.squares", x.squares, ndim=1, dtypes=f32, device=packed.device)
        row = x.sums[:, :k]
    else:
        row = x.row if isinstance(x, StreamRow) else x
        check_tensor(
            "x", row, ndim=2, dtypes=f32 if isinstance(x, StreamRow) else (torch.bfloat16,), device=packed.device
        )
        check_dim("x", row.shape[1], k, "in_features")
    fusion = RowFusion.of(
        row, n, k, norm_weight=norm_weight, eps=eps, residual=None, gated=gated, out_dtype=out_dtype or torch.bfloat16
    )
    if into is None:
        out: torch.Tensor | StreamRow | GateSums = torch.empty(
            1, fusion.features, dtype=fusion.out_dtype, device=packed.device
        )
    else:
        target = into.row if isinstance(into, StreamRow) else into.sums
        check_tensor("into", target, ndim=2, dtypes=f32, device=packed.device)
        check_dim("into", target.shape[1], n, "out_features")
        out = into
    _int4_fragments(x, packed, scales, zeros, bias, out, norm_weight, eps, None, gated, rotary)
    return out


def _rotate_and_write(qkv: torch.Tensor, rotary: RotaryWrite) -> None:
    """``rotary_write_kv`` on a qkv row the epilogue could not finish; the rotated q back into its columns."""
    d, hq, hkv = rotary.head_dim, rotary.num_q_heads, rotary.num_kv_heads
    q, k, v = (t.view(1, -1, d) for t in qkv.split((hq * d, hkv * d, hkv * d), dim=-1))
    q_rotated = rotary_write_kv(
        q, k, v, rotary.positions, rotary.cos_sin_cache, rotary.k_cache, rotary.v_cache, rotary.slot_mapping
    )
    qkv[:, : hq * d] = q_rotated.view(1, -1)
