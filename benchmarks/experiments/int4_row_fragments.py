"""The unfused form of kernels/int4_fragments.py's one-row int4 tensor-core kernel, timed by
``int4_row_tensor_cores``, with what the shipped kernel leaves out: words in the row layout (``TILE_N`` 0),
and a prefetch of the next group's loads before the current group's arithmetic. Each program writes its
split's float32 sums; the harness adds them up. The reduction order, layouts and ``twin`` are the shipped
kernel's.
"""

from __future__ import annotations

from typing import Any

import torch
from omni_gateway.kernels.int4_fragments import A_ORDER, DEQUANT, GROUP, X_ORDER, group_product, layouts, twin
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["A_ORDER", "X_ORDER", "launch", "layouts", "sm90_launch", "twin"]


@gluon.jit
def _group(w_ptrs, x_ptrs, z_ptrs, s_ptrs, kb, K, GROUP: gl.constexpr, TILE_N: gl.constexpr):
    """One group's words, activations, zero points and scales at feature ``kb``."""
    step = 16 * TILE_N if TILE_N else 16  # words from one group to the next along a row
    words = gl.load(w_ptrs + gl.multiple_of((kb // GROUP) * step, 16), eviction_policy="evict_first")
    return words, gl.load(x_ptrs + kb), gl.load(z_ptrs + kb // GROUP), gl.load(s_ptrs + kb // GROUP)


@gluon.jit
def _fragments_kernel(
    w_ptr,
    x_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    K,
    stride_w,
    k_per_split,
    MMA: gl.constexpr,
    A: gl.constexpr,
    B: gl.constexpr,
    X: gl.constexpr,
    TILE: gl.constexpr,
    WORDS: gl.constexpr,
    DEQUANT: gl.constexpr,
    BLOCK_N: gl.constexpr,
    GROUP: gl.constexpr,
    PREFETCH: gl.constexpr,
    TILE_N: gl.constexpr,
):
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    rows_w = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WORDS))
    word = gl.arange(0, 16, layout=gl.SliceLayout(0, WORDS))
    if TILE_N:  # tiles of TILE_N rows by one group, contiguous (``int4_row_layout.tiled``)
        tile = (rows_w // TILE_N).to(gl.int64) * (K // GROUP) * TILE_N + rows_w % TILE_N
        w_ptrs = w_ptr + tile[:, None] * 16 + word[None, :]
    else:
        w_ptrs = w_ptr + rows_w.to(gl.int64)[:, None] * stride_w + word[None, :]
    x_ptrs = x_ptr + gl.arange(0, GROUP, layout=X)
    rows_z = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, TILE)))
    z_ptrs = z_ptr + rows_z * (K // GROUP)
    rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    s_ptrs = s_ptr + rows * (K // GROUP)
    total = gl.zeros([BLOCK_N, 8], gl.float32, MMA)
    k_lo = pid_k * k_per_split
    k_last = k_lo + k_per_split - GROUP
    if PREFETCH:
        nxt = _group(w_ptrs, x_ptrs, z_ptrs, s_ptrs, k_lo, K, GROUP, TILE_N)
    for kb in range(k_lo, k_lo + k_per_split, GROUP):
        if PREFETCH:
            # the next group's loads go out before this group's arithmetic (the last reloads itself)
            words, xv, zero, scale = nxt
            nxt = _group(w_ptrs, x_ptrs, z_ptrs, s_ptrs, gl.minimum(kb + GROUP, k_last), K, GROUP, TILE_N)
        else:
            words, xv, zero, scale = _group(w_ptrs, x_ptrs, z_ptrs, s_ptrs, kb, K, GROUP, TILE_N)
        total = group_product(words, xv, zero, scale, total, MMA, A, B, TILE, DEQUANT, BLOCK_N)
    column = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    gl.store(out_ptr + pid_k * N + rows[:, None] + column[None, :] * 0, total, mask=column[None, :] == 0)


def _arguments(
    x: torch.Tensor,
    words: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    parts: torch.Tensor,
    block_n: int,
    warps: int,
    split: int,
    prefetch: bool,
    tile_n: int,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The kernel's positional arguments and keywords."""
    n, k = scales.shape[0], scales.shape[1] * GROUP
    if n % block_n or k % (GROUP * split):
        raise ValueError(f"{n} x {k} does not divide into blocks of {block_n} rows and {split} splits of groups")
    lay = layouts(block_n, warps)
    # The row stride in words goes apart from K so the launcher marks it a multiple of 16: 128-bit word loads.
    args = (words, x, scales, zeros, parts, n, k, k // 8, k // split)
    kwargs = dict(
        **lay.loop_kwargs(),
        DEQUANT=DEQUANT,
        BLOCK_N=block_n,
        GROUP=GROUP,
        PREFETCH=prefetch,
        TILE_N=tile_n,
        num_warps=warps,
    )
    return args, kwargs


def launch(
    x: torch.Tensor,
    words: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    block_n: int,
    warps: int,
    split: int,
    prefetch: bool,
    tile_n: int = 0,
) -> torch.Tensor:
    """``[split, N]`` float32 partial sums of one bfloat16 row ``x`` [1, K] against int32 ``words`` [N, K / 8]
    (nibble i of word j is feature 8j + i) with per-group ``scales`` and uint8 ``zeros`` [N, K / GROUP].
    With ``tile_n`` the words come as ``int4_row_layout.tiled(words, tile_n)``."""
    parts = torch.empty(split, scales.shape[0], device=x.device, dtype=torch.float32)
    args, kwargs = _arguments(x, words, scales, zeros, parts, block_n, warps, split, prefetch, tile_n)
    _fragments_kernel[(scales.shape[0] // block_n, split)](*args, **kwargs)
    return parts


def sm90_launch(n: int, k: int, *, block_n: int, warps: int, split: int, prefetch: bool) -> Any:
    """The launch at ``n`` x ``k``, on CPU tensors, for ``benchmarks.analysis.kernel_sass`` to compile."""
    from benchmarks.analysis.kernel_sass import Launch

    words = torch.zeros(n, k // 8, dtype=torch.int32)
    scales = torch.zeros(n, k // GROUP, dtype=torch.bfloat16)
    zeros = torch.zeros(n, k // GROUP, dtype=torch.uint8)
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    parts = torch.zeros(split, n, dtype=torch.float32)
    args, kwargs = _arguments(x, words, scales, zeros, parts, block_n, warps, split, prefetch, 0)
    return Launch(_fragments_kernel, args, kwargs)
