"""Launch configs of the decode-sized quantized linears (kernels/quant_gemv.py): a table measured on
the H200 for the Llama-3.1-8B linear shapes, and a fallback for every other shape.

Keys are ``(format, rows bucket, out_features, in_features)`` with the buckets 1, 2, 4, 8, 16 (rows
rounded up to a power of two); values ``(block_n, block_k, num_warps, stages, split_k)``. The table
comes from ``python -m benchmarks.quant_sweep`` (docs/benchmarks.md, "Quantized weights on the H200").
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

FP8_CHANNEL = 0
FP8_BLOCKWISE = 1
INT4_GROUPED = 2
MAX_GEMV_ROWS = 16  # the dot path's 16-row activation tile
_TARGET_PROGRAMS = 264  # two per SM of the H200's 132


@dataclass(frozen=True)
class QuantLinearConfig:
    """Decode launch parameters: ``block_n`` output features per program, ``block_k`` input features
    per loop step (int4 and per-block FP8 split a step into sub-tiles inside one scale group),
    ``stages`` steps in flight, ``split_k`` programs sharing each output block. Above
    ``max_dot_rows`` rows the GEMM path runs (kernels/quant_gemm.py), where FP8 per channel uses the
    FP8 tensor cores (W8A8, ``torch._scaled_mm``) unless ``scaled_mm`` is False."""

    block_n: int = 8
    block_k: int = 512
    num_warps: int = 4
    stages: int = 3
    split_k: int = 1
    max_dot_rows: int = MAX_GEMV_ROWS
    scaled_mm: bool = True

    def __post_init__(self) -> None:
        for name, low, high in (
            ("block_n", 1, 128),
            ("block_k", 16, 4096),
            ("num_warps", 1, 16),
            ("split_k", 1, 64),
        ):
            value = getattr(self, name)
            if value < low or value > high or value & (value - 1):
                raise ValueError(f"QuantLinearConfig.{name}: expected a power of two in [{low}, {high}], got {value}")
        if self.stages < 1:
            raise ValueError(f"QuantLinearConfig.stages: expected at least 1, got {self.stages}")
        if not 0 <= self.max_dot_rows <= MAX_GEMV_ROWS:
            raise ValueError(
                f"QuantLinearConfig.max_dot_rows: expected 0..{MAX_GEMV_ROWS} (the decode kernel's row tile), "
                f"got {self.max_dot_rows}"
            )


# (format, rows bucket, N, K) -> (block_n, block_k, num_warps, stages, split_k), measured on the H200.
_TUNED: dict[tuple[int, int, int, int], tuple[int, int, int, int, int]] = {}


def rows_bucket(rows: int) -> int:
    return 1 if rows <= 1 else min(MAX_GEMV_ROWS, triton.next_power_of_2(rows))


def _fill_split(programs: int, k: int, block_k: int) -> int:
    """Splits of the reduction until about two programs run per SM, each keeping 4+ steps."""
    split = 1
    while programs * split < _TARGET_PROGRAMS and k // (split * 2) >= 4 * block_k:
        split *= 2
    return split


def fallback_config(fmt: int, rows: int, n: int, k: int) -> QuantLinearConfig:
    """One row: 8 features a program (16 for int4, whose rows are half as many bytes) and 512-element
    steps; 2+ rows: 16 features (``tl.dot``'s minimum) and 256-element steps; split-K fills the SMs."""
    if rows <= 1:
        block_n, block_k = (16, 512) if fmt == INT4_GROUPED else (8, 512)
    else:
        block_n, block_k = 16, 256
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    split = _fill_split(triton.cdiv(n, block_n), k, block_k)
    return QuantLinearConfig(block_n=block_n, block_k=block_k, split_k=split)


def tuned_config(fmt: int, rows: int, n: int, k: int) -> QuantLinearConfig:
    hit = _TUNED.get((fmt, rows_bucket(rows), n, k))
    if hit is None:
        return fallback_config(fmt, rows, n, k)
    block_n, block_k, num_warps, stages, split_k = hit
    return QuantLinearConfig(block_n=block_n, block_k=block_k, num_warps=num_warps, stages=stages, split_k=split_k)
