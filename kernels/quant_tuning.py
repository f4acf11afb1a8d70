"""Launch configs of the decode-sized quantized linears (kernels/quant_gemv.py): tables measured on the
H200 and the H100 for the Llama-3.1-8B linear shapes, and a fallback for every other shape.

``_TUNED`` keys are ``(format, rows bucket, out_features, in_features)`` with the buckets 1, 2, 4, 8, 16
(rows rounded up to a power of two); ``_TUNED_INT4_DOT`` holds int4 at 2-16 rows by shape alone. Values
are ``(block_n, block_k, num_warps, stages, split_k)``. The tables come from ``python -m
benchmarks.quant_sweep`` (docs/benchmarks.md, "Quantized one-row linears").
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


# (format, rows bucket, N, K) -> (block_n, block_k, num_warps, stages, split_k): the fastest config that
# matched the twins in ``python -m benchmarks.quant_sweep`` on the H200 (2026-12-04, bf16 activations;
# the comment is its time and the speedup over bf16 at that shape). Entries marked H100 and one-row int4
# come from ``python -m benchmarks.quant_sweep --skip-prefill --formats int4,fp8-channel --rows 1`` on
# an H100 (2026-12-05; int4 again after its last kernel change), which times one row through the fused
# kernel the batch-1 decode runs at that shape.
_TUNED: dict[tuple[int, int, int, int], tuple[int, int, int, int, int]] = {
    (FP8_CHANNEL, 1, 4096, 14336): (8, 1024, 4, 3, 1),  # 16.4 us, 1.76x bf16
    (FP8_CHANNEL, 1, 6144, 4096): (8, 512, 4, 4, 1),  # 8.7 us, 1.63x bf16
    (FP8_CHANNEL, 1, 28672, 4096): (32, 256, 4, 3, 1),  # 30.7 us, 1.81x bf16
    (FP8_CHANNEL, 1, 4096, 4096): (8, 1024, 4, 3, 1),  # H100, fused: 7.5 us, 2.13x bf16
    (FP8_CHANNEL, 1, 128256, 4096): (16, 512, 4, 3, 1),  # H100, fused: 168.5 us, 1.94x bf16
    (FP8_CHANNEL, 2, 4096, 14336): (64, 256, 8, 3, 4),  # 25.2 us, 1.26x bf16
    (FP8_CHANNEL, 2, 6144, 4096): (32, 256, 4, 3, 4),  # 13.7 us, 1.19x bf16
    (FP8_CHANNEL, 2, 28672, 4096): (64, 128, 4, 4, 4),  # 42.2 us, 1.49x bf16
    (FP8_CHANNEL, 4, 4096, 14336): (64, 256, 8, 3, 4),  # 25.3 us, 1.25x bf16
    (FP8_CHANNEL, 4, 6144, 4096): (32, 256, 4, 3, 4),  # 13.8 us, 1.13x bf16
    (FP8_CHANNEL, 4, 28672, 4096): (64, 128, 4, 4, 4),  # 42.1 us, 1.48x bf16
    (FP8_CHANNEL, 8, 4096, 14336): (64, 256, 8, 3, 4),  # 25.4 us, 1.26x bf16
    (FP8_CHANNEL, 8, 6144, 4096): (32, 256, 4, 3, 4),  # 13.7 us, 1.14x bf16
    (FP8_CHANNEL, 8, 28672, 4096): (32, 256, 4, 3, 1),  # 42.2 us, 1.49x bf16
    (FP8_CHANNEL, 16, 4096, 14336): (64, 256, 8, 3, 4),  # 25.3 us, 1.27x bf16
    (FP8_CHANNEL, 16, 6144, 4096): (32, 256, 4, 3, 4),  # 13.7 us, 1.15x bf16
    (FP8_CHANNEL, 16, 28672, 4096): (32, 256, 4, 3, 1),  # 42.4 us, 1.48x bf16
    # Per-block FP8 at one row was measured with an earlier kernel (a per-element scale gather);
    # the 2..16-row entries stand.
    (FP8_BLOCKWISE, 2, 4096, 14336): (32, 256, 4, 3, 4),  # 26.3 us, 1.20x bf16
    (FP8_BLOCKWISE, 2, 6144, 4096): (32, 256, 4, 3, 4),  # 14.3 us, 1.14x bf16
    (FP8_BLOCKWISE, 2, 28672, 4096): (32, 256, 4, 3, 1),  # 45.1 us, 1.39x bf16
    (FP8_BLOCKWISE, 4, 4096, 14336): (32, 256, 4, 3, 4),  # 26.3 us, 1.20x bf16
    (FP8_BLOCKWISE, 4, 6144, 4096): (32, 256, 4, 3, 4),  # 14.4 us, 1.08x bf16
    (FP8_BLOCKWISE, 4, 28672, 4096): (32, 256, 4, 3, 1),  # 45.2 us, 1.38x bf16
    (FP8_BLOCKWISE, 8, 4096, 14336): (32, 256, 4, 3, 4),  # 26.3 us, 1.21x bf16
    (FP8_BLOCKWISE, 8, 6144, 4096): (32, 256, 4, 3, 4),  # 14.4 us, 1.09x bf16
    (FP8_BLOCKWISE, 8, 28672, 4096): (32, 256, 4, 3, 1),  # 45.1 us, 1.40x bf16
    (FP8_BLOCKWISE, 16, 4096, 14336): (32, 256, 4, 3, 4),  # 26.5 us, 1.22x bf16
    (FP8_BLOCKWISE, 16, 6144, 4096): (32, 256, 4, 3, 4),  # 14.5 us, 1.09x bf16
    (FP8_BLOCKWISE, 16, 28672, 4096): (32, 256, 4, 3, 1),  # 44.9 us, 1.40x bf16
    # One row of int4: the subnormal plane kernel with the fusions of the batch-1 decode, on an H100
    # (2026-12-06 18:35 UTC, ``--formats int4 --rows 1``). One stage: the words load straight into registers,
    # with no cp.async pipeline and none of its block barriers per step (three stages were 15% slower).
    (INT4_GROUPED, 1, 4096, 4096): (128, 256, 8, 1, 8),  # 8.5 us, 1.88x bf16
    (INT4_GROUPED, 1, 4096, 14336): (128, 256, 8, 1, 8),  # 20.1 us, 2.53x bf16
    (INT4_GROUPED, 1, 6144, 4096): (128, 256, 4, 1, 8),  # 10.7 us, 1.80x bf16
    (INT4_GROUPED, 1, 28672, 4096): (128, 256, 4, 1, 2),  # 33.5 us, 2.25x bf16 (split 8: 34.7)
    (INT4_GROUPED, 1, 128256, 4096): (128, 256, 4, 1, 1),  # 131.5 us, 2.49x bf16 (split 4: 135.9)
}

# 2-16 rows of int4, (N, K) -> the same tuple: the tensor-core tile of kernels/quant_tiles.py, swept at 4 rows
# on an H100 (2026-12-06). Its activation tile is 16 rows whatever the step's count, so one entry serves
# every bucket. Wide one-stage tiles won where the activations' loads weigh most (gate_up took 150.3 us with
# the 32-feature, three-stage config before).
_TUNED_INT4_DOT: dict[tuple[int, int], tuple[int, int, int, int, int]] = {
    (4096, 4096): (64, 256, 4, 1, 4),  # 18.1 us, 0.85x bf16
    (4096, 14336): (64, 128, 4, 4, 4),  # 52.1 us, 0.83x bf16
    (6144, 4096): (64, 256, 4, 1, 4),  # 21.9 us, 0.95x bf16
    (28672, 4096): (128, 128, 4, 1, 4),  # 65.1 us, 1.30x bf16
    (128256, 4096): (128, 128, 4, 1, 4),  # 268.2 us, 1.39x bf16
}


def rows_bucket(rows: int) -> int:
    return 1 if rows <= 1 else min(MAX_GEMV_ROWS, triton.next_power_of_2(rows))


def _fill_split(programs: int, k: int, block_k: int) -> int:
    """Splits of the reduction until about two programs run per SM, each keeping 4+ steps."""
    split = 1
    while programs * split < _TARGET_PROGRAMS and k // (split * 2) >= 4 * block_k:
        split *= 2
    return split


def fallback_config(fmt: int, rows: int, n: int, k: int) -> QuantLinearConfig:
    """Shaped after the sweep's winners: one row of FP8 per channel takes 8 features and 512-element
    steps, per-block FP8 32 features and 256 (two 128-wide sub-tiles), int4 64 features and 256; 2+ rows
    take 32 features and 256-element steps. Split-K then fills the SMs."""
    if rows <= 1:
        block_n, block_k = {FP8_CHANNEL: (8, 512), FP8_BLOCKWISE: (32, 256)}.get(fmt, (64, 256))
    else:
        block_n, block_k = 32, 256
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    split = _fill_split(triton.cdiv(n, block_n), k, block_k)
    return QuantLinearConfig(block_n=block_n, block_k=block_k, split_k=split)


def tuned_config(fmt: int, rows: int, n: int, k: int) -> QuantLinearConfig:
    if fmt == INT4_GROUPED and rows > 1:
        hit = _TUNED_INT4_DOT.get((n, k))
    else:
        hit = _TUNED.get((fmt, rows_bucket(rows), n, k))
    if hit is None:
        return fallback_config(fmt, rows, n, k)
    block_n, block_k, num_warps, stages, split_k = hit
    return QuantLinearConfig(block_n=block_n, block_k=block_k, num_warps=num_warps, stages=stages, split_k=split_k)
