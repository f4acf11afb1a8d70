"""Launch parameters of the paged attention kernels (kernels/paged_decode.py, kernels/paged_prefill.py):
the split-KV decode's tiles and split counts, chosen from tensor shapes alone so that every launch is
CUDA-graph capturable, and the prefill's tiles."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
from omni_gateway.kernels.validation import next_pow2

_MAX_SPLITS = 64


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the split-KV decode kernel."""

    block_n: int = 64  # KV tokens per inner-loop tile
    num_warps: int = 4
    num_stages: int = 3
    # At most this many (sequence, KV head, split) programs, unless one split per (sequence, KV
    # head) already exceeds it: the split count grows while batch x KV heads x splits stays within
    # it, so small batches get more splits than large ones and no launch spills into a second,
    # mostly empty wave of programs.
    target_programs: int = 396
    # Never split a context finer than this many tokens: the split granularity of small batches,
    # whose split count target_programs alone would push up to _MAX_SPLITS. Each split is also
    # rounded up to whole block_n tiles, so min_split_tokens == block_n gives one tile per split.
    min_split_tokens: int = 256
    # Merge splits in the last program of each (sequence, KV head) to finish, found through an
    # atomic counter, instead of in a second kernel: one launch fewer per call. Launches that may
    # run at once (on two streams) must not share counters: each caller passes its own
    # (``split_counters``), or they share the device's and one stream.
    fused_reduce: bool = True
    # Merge in-kernel only up to this many splits; a launch with more splits runs the second
    # kernel. The merging program loads every partial of its query-head group at once, so its cost
    # grows with the partials' bytes rather than with a chain of per-split loads. The split count
    # is a function of shapes, so this choice is too: launches stay CUDA-graph capturable.
    fused_max_splits: int = 8

    def __post_init__(self) -> None:
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"DecodeConfig.block_n: expected a power of two >= 16, got {self.block_n}")
        if self.target_programs < 1 or self.min_split_tokens < 1:
            raise ValueError(
                "DecodeConfig: target_programs and min_split_tokens must be positive, got "
                f"{self.target_programs} and {self.min_split_tokens}"
            )
        if self.fused_max_splits < 1:
            raise ValueError(f"DecodeConfig.fused_max_splits: expected a positive count, got {self.fused_max_splits}")

    def merges_in_kernel(self, num_splits: int) -> bool:
        """Whether a launch of ``num_splits`` splits merges them in the split kernel itself."""
        return self.fused_reduce and 1 < num_splits <= self.fused_max_splits


@dataclass(frozen=True)
class PrefillConfig:
    """Launch parameters of the varlen prefill kernel."""

    block_m: int = 128  # query rows (tokens x padded GQA group) per program
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


def num_decode_splits(batch: int, num_kv_heads: int, max_context: int, config: DecodeConfig) -> tuple[int, int]:
    """(num_splits, tokens_per_split) for a decode launch; a function of shapes only."""
    base = max(1, batch * num_kv_heads)
    splits = min(
        config.target_programs // base,
        max(1, max_context // config.min_split_tokens),
        _MAX_SPLITS,
    )
    splits = max(1, splits)
    per_split = math.ceil(math.ceil(max_context / splits) / config.block_n) * config.block_n
    per_split = max(per_split, config.block_n)
    return math.ceil(max_context / per_split) if max_context > 0 else 1, per_split


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_decode_config(
    q: torch.Tensor, num_kv_heads: int = 1, max_context: int = 0, kv_element_size: int | None = None
) -> DecodeConfig:
    """Decode launch parameters for ``q``'s device and a launch of ``q.shape[0]`` sequences over
    ``num_kv_heads`` KV heads and block tables covering ``max_context`` tokens (shapes only, so the
    choice is CUDA-graph capturable) of a cache of ``kv_element_size``-byte elements (None: ``q``'s).
    The CPU interpreter gets small tiles."""
    if q.device.type != "cuda":
        return DecodeConfig(block_n=32, num_warps=4, num_stages=1, target_programs=16, min_split_tokens=32)
    return gpu_decode_config(
        _sm_count(q.device.index or 0),
        q.shape[0],
        num_kv_heads,
        max_context,
        head_dim=q.shape[-1],
        element_size=kv_element_size or q.element_size(),
    )


# What the pipeliner makes of each tile on sm_90 for bf16 and head_dim 128 (Triton 3.6; compiled
# sizes as `python -m benchmarks.kernels` records them, decode_kernel_resources): 64-token tiles at
# 3 stages keep one K/V tile in flight in 39 KB of shared memory (four programs per SM by registers),
# 5 stages two tiles in 72 KB (three per SM), 128-token tiles at 6 stages two tiles in 140 KB (one
# program per SM).
_MANY_PAIRS = DecodeConfig(block_n=64, num_stages=3, min_split_tokens=64, fused_max_splits=32)
_MANY_PAIRS_FP8 = replace(_MANY_PAIRS, block_n=128, min_split_tokens=128)  # the bytes of bf16's 64 tokens
_SOME_PAIRS = DecodeConfig(block_n=64, num_stages=5, min_split_tokens=64, fused_max_splits=32)
_FEW_PAIRS = DecodeConfig(block_n=128, num_stages=6, min_split_tokens=128, fused_max_splits=32)
_TILE_BYTES = 128 * 128 * 2  # the largest K tile above; wider heads or elements get fewer tokens


def gpu_decode_config(
    sm_count: int,
    batch: int = 1,
    num_kv_heads: int = 1,
    max_context: int = 0,
    *,
    head_dim: int = 128,
    element_size: int = 2,
) -> DecodeConfig:
    """The decode launch parameters of a GPU with ``sm_count`` SMs for a launch of ``batch`` x
    ``num_kv_heads`` (sequence, KV head) pairs over ``max_context`` tokens of a cache of
    ``element_size``-byte elements.

    Decode streams K/V, so what counts is the bytes in flight across the GPU while every program
    fits in one wave. Swept on an H200 (docs/benchmarks.md, "Paged decode attention"):
    - two or more pairs per SM: one split each, 64-token tiles at 3 stages (small programs balance
      the waves);
    - one to two pairs per SM: one split, two 64-token tiles in flight (three programs per SM);
    - a quarter to one pair per SM: 128-token tiles, two in flight, one program per SM, split until
      the SMs are used, unless the context is so short that those splits would leave most SMs idle;
    - fewer pairs, or too short a context: 64-token one-tile splits, merged in-kernel up to 32. An
      engine's block tables are as wide as its longest allowed context, which is this choice's
      only view of the context, while a batch-1 decode mostly reads far fewer tokens; many
      one-tile splits then keep its latency low (on the H200 the 128-token splits made the 8B
      model's batch-1 decode graph 4.33 ms against 4.17-4.28).
    With two or more pairs per SM an fp8 cache takes 128-token tiles, the bytes of bf16's 64: on an
    H100 they took 6-26% less time than 64-token ones at 64-256 sequences of 512-2,048 tokens (64-token
    fp8 tiles reached 47-73% of the copy bandwidth, bf16's 89-100%).
    Tiles hold at most 128 tokens of bf16 head_dim 128; wider rows get proportionally fewer tokens.
    """
    pairs = max(1, batch * num_kv_heads)
    if pairs >= 2 * sm_count and element_size < 2:
        config = replace(_MANY_PAIRS_FP8, target_programs=3 * sm_count)
    elif sm_count <= pairs < 2 * sm_count:
        config = replace(_SOME_PAIRS, target_programs=3 * sm_count)
    elif sm_count // 4 <= pairs < sm_count and pairs * (max_context // _FEW_PAIRS.block_n) >= sm_count // 2:
        config = replace(_FEW_PAIRS, target_programs=sm_count)
    else:  # many pairs, or too few / too short a context for the coarse splits
        config = replace(_MANY_PAIRS, target_programs=3 * sm_count)
    block_n = max(16, min(config.block_n, _TILE_BYTES // (next_pow2(head_dim) * element_size)))
    return replace(config, block_n=block_n, min_split_tokens=min(config.min_split_tokens, block_n))


def decode_launch_key(
    sm_count: int, batch: int, num_kv_heads: int, max_context: int, *, head_dim: int = 128, element_size: int = 2
) -> tuple[int, ...]:
    """What a GPU decode launch of this shape compiles for (its tile, pipeline depth and split
    constexprs): two shapes with one key run one compiled kernel, so a warm-up needs one shape per key."""
    config = gpu_decode_config(sm_count, batch, num_kv_heads, max_context, head_dim=head_dim, element_size=element_size)
    num_splits, _ = num_decode_splits(batch, num_kv_heads, max_context, config)
    fused = config.merges_in_kernel(num_splits)
    return (config.block_n, config.num_warps, config.num_stages, num_splits == 1, fused, max(2, next_pow2(num_splits)))


def default_prefill_config(q: torch.Tensor) -> PrefillConfig:
    """Prefill launch parameters: the H200 sweep's best 96 KB-shared-memory tile, small tiles on the CPU."""
    if q.device.type != "cuda":
        return PrefillConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)
    return PrefillConfig()
