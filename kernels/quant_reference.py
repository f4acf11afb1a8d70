"""Pure-torch twins of the quantized linear kernels (kernels/quant_linear.py and the decode and prefill
kernels behind it): the formats' spec, the quantizers that produce them, and the de-quantization.

Formats (weights are ``[N, K]``, output features by input features, like ``F.linear``):

- FP8 per channel: ``weight`` float8_e4m3fn ``[N, K]``, ``scale`` float32 ``[N]``;
  ``w[n, k] = weight[n, k] * scale[n]``.
- FP8 per block: ``scale`` float32 ``[cdiv(N, 128), cdiv(K, 128)]``;
  ``w[n, k] = weight[n, k] * scale[n // 128, k // 128]`` (vLLM's ``weight_scale_inv``).
- int4, groups of ``group_size`` along K: ``packed`` uint8 ``[N, K / 2]`` with element ``2j`` in the
  low nibble of byte ``j`` and ``2j + 1`` in the high one; ``scales`` ``[N, K / group_size]`` in the
  activation dtype; ``zeros`` uint8 ``[N, K / group_size]`` (0..15);
  ``w[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g]`` with ``g = k // group_size``.
  AWQ and GPTQ checkpoints are repacked into this layout at load.
- int4 in row tiles: the same bytes as uint8 ``[N / T, K / G, T, G / 2]`` (G the group size), element
  ``[i, g, r, b]`` being the row layout's ``packed[i * T + r, g * G / 2 + b]``: one group's bytes of T
  consecutive rows lie in one run of memory, which a block of rows read a group at a time streams.
  ``tile_int4`` and ``untile_int4`` convert; scales and zeros keep their ``[N, K / G]`` layout. The
  layout describes itself: a 2-D ``packed`` holds rows (T = 1), a 4-D one tiles of ``T = shape[2]``
  rows and groups of ``G = 2 * shape[3]``. ``dequantize_int4`` and ``int4_linear`` take either;
  ``pack_int4`` and ``unpack_int4`` speak the row layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_BLOCK = 128  # the block edge of per-block FP8 scales (DeepSeek/vLLM's [128, 128])
# Rows of an int4 tile on the GPU: 64 rows of a 128-wide group are 4 KB in one run.
INT4_ROW_TILE = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def quantize_fp8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output row scaled so its largest magnitude maps to FP8_MAX."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(1e-12)
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8_per_block(weight: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per ``block x block`` tile (ragged edge tiles included)."""
    n, k = weight.shape
    nb, kb = _cdiv(n, block), _cdiv(k, block)
    w = F.pad(weight.float(), (0, kb * block - k, 0, nb * block - n))
    tiles = w.view(nb, block, kb, block)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * block, kb * block)[:n, :k]
    return q.contiguous().to(FP8_DTYPE), scale


def fp8_scale_per_element(scale: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """float32 ``[N, K]`` scale of every weight element, for either scale layout."""
    if scale.dim() == 1:
        return scale.float()[:, None].expand(n, k)
    per_row = scale.float().repeat_interleave(FP8_BLOCK, dim=0)[:n]
    return per_row.repeat_interleave(FP8_BLOCK, dim=1)[:, :k]


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    n, k = weight.shape
    return (weight.float() * fp8_scale_per_element(scale, n, k)).to(dtype)


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ dequantize_fp8(weight, scale).T (+ bias)`` in x's dtype."""
    return F.linear(x, dequantize_fp8(weight, scale, x.dtype), bias)


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic activation quantization (W8A8 prefill): float32 ``[M, 1]`` scales ``max|x| / FP8_MAX`` per
    row and the e4m3 rows ``x / scale``."""
    xf = x.float()
    scale = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear_dynamic(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The W8A8 product of many-row bf16 activations with per-channel FP8 weights: activations
    quantized per token, float32 accumulation, both scales on the sums, then ``bias``; in x's dtype."""
    q, x_scale = quantize_fp8_per_token(x)
    out = (q.float() @ weight.float().T) * x_scale * scale.float()[None, :]
    return (out if bias is None else out + bias.float()).to(x.dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K]`` of values 0..15 -> uint8 ``[N, K / 2]``, even columns in the low nibbles."""
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_int4``: uint8 ``[N, 2 * packed.shape[1]]``."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack((low, high), dim=-1).flatten(1)


def quantize_int4(
    weight: torch.Tensor, group_size: int = 128, *, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest min/max quantization per group: ``(packed, scales, zeros)``; scales in weight's
    dtype (what AWQ/GPTQ store). ``symmetric`` fixes every zero point at 8 (GPTQ's ``sym=True``)."""
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"quantize_int4: in_features {k} is not a multiple of group_size {group_size}")
    groups = weight.float().view(n, k // group_size, group_size)
    if symmetric:
        scales = (groups.abs().amax(dim=2) / 7.5).clamp_min(1e-8).to(weight.dtype).float()
        zeros = torch.full_like(scales, 8.0)
    else:
        lo, hi = groups.amin(dim=2).clamp(max=0.0), groups.amax(dim=2).clamp(min=0.0)
        scales = ((hi - lo) / 15.0).clamp_min(1e-8).to(weight.dtype).float()
        zeros = (-lo / scales).round().clamp(0, 15)
    q = (groups / scales[..., None] + zeros[..., None]).round().clamp(0, 15).view(n, k)
    return pack_int4(q), scales.to(weight.dtype), zeros.to(torch.uint8)


def tile_int4(packed: torch.Tensor, group_size: int, rows: int = INT4_ROW_TILE) -> torch.Tensor:
    """Row layout ``[N, K / 2]`` -> row tiles ``[N / rows, K / group_size, rows, group_size / 2]``."""
    if packed.dim() != 2:
        raise ValueError(f"tile_int4: expected the row layout [N, K / 2], got shape {tuple(packed.shape)}")
    n, k = packed.shape[0], packed.shape[1] * 2
    if rows < 1 or group_size < 2 or group_size % 2:
        raise ValueError(f"tile_int4: expected rows >= 1 and an even group_size, got {rows} and {group_size}")
    if n % rows or k % group_size:
        raise ValueError(
            f"tile_int4: expected out_features a multiple of {rows} rows and in_features a multiple of "
            f"group_size {group_size}, got [N, K] = [{n}, {k}]"
        )
    return packed.view(n // rows, rows, k // group_size, group_size // 2).transpose(1, 2).contiguous()


def int4_layout(packed: torch.Tensor) -> tuple[int, int, int]:
    """``(N, K, T)`` of ``packed`` in either int4 layout: T rows a tile, 1 for the row layout."""
    if packed.dim() == 4:
        tiles, groups, rows, group_bytes = packed.shape
        return tiles * rows, groups * group_bytes * 2, rows
    if packed.dim() == 2:
        return packed.shape[0], packed.shape[1] * 2, 1
    raise ValueError(
        f"int4 weights: expected rows [N, K / 2] or row tiles [N / T, K / G, T, G / 2], got shape {tuple(packed.shape)}"
    )


def untile_int4(packed: torch.Tensor) -> torch.Tensor:
    """Row tiles -> the row layout ``[N, K / 2]``; a 2-D (row layout) ``packed`` is returned as is."""
    if packed.dim() == 2:
        return packed
    if packed.dim() != 4:
        raise ValueError(
            f"untile_int4: expected [N / T, K / G, T, G / 2] or [N, K / 2], got shape {tuple(packed.shape)}"
        )
    tiles, groups, rows, group_bytes = packed.shape
    return packed.transpose(1, 2).reshape(tiles * rows, groups * group_bytes)


def dequantize_int4(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The ``[N, K]`` weight in ``dtype``, from either int4 layout."""
    q = unpack_int4(untile_int4(packed)).float()
    group_size = q.shape[1] // scales.shape[1]
    if packed.dim() == 4 and packed.shape[3] * 2 != group_size:
        raise ValueError(
            f"dequantize_int4: row tiles of {packed.shape[3] * 2} weights a row (shape {tuple(packed.shape)}) "
            f"do not match the scales' group of {group_size}"
        )
    z = zeros.float().repeat_interleave(group_size, dim=1)
    s = scales.float().repeat_interleave(group_size, dim=1)
    return ((q - z) * s).to(dtype)


def int4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ dequantize_int4(packed, scales, zeros).T (+ bias)`` in x's dtype, ``packed`` in either layout."""
    return F.linear(x, dequantize_int4(packed, scales, zeros, x.dtype), bias)
