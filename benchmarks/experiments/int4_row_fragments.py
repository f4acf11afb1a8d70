"""One row of int4 on the tensor cores with each thread's words de-quantized straight into its own ``mma``
fragment (Gluon, explicit layouts; sm_80+), the kernel timed by ``int4_row_tensor_cores``.

``mma.m16n8k16`` gives lane ``l`` the weight rows ``l / 4`` and ``l / 4 + 8`` and the reduction slots
``2c, 2c + 1, 2c + 8, 2c + 9`` of each 16 (``c = l % 4``), a pair to a 32-bit register. The reduction order
is free, so the kernel picks it to fit the words: lane ``c`` of a row reads the row's words ``4c .. 4c + 3``
of the group (16 contiguous bytes), and the pair in one register is nibbles ``i`` and ``i + 4`` of one word,
``(w >> 4i) & 0x000F000F | 0x43004300``: two bfloat16 ``128 + q``, less ``128 + zero`` in one packed
subtraction, so the operand holds ``q - zero`` exactly. Three instructions a pair; no shared memory, no
shuffle (the conversion into the operand's layout is asserted trivial). The activations are the second
operand, one column repeated over the eight: lane ``c`` reads the 32 activations of its words (64 contiguous
bytes) and pairs them the same way. Each group's sums leave the tensor cores in float32, times its scale.

``A_ORDER`` and ``X_ORDER`` are that reduction order, applied to the ``[rows, word, nibble]`` tile and to the
group's activations; ``twin`` runs them in torch, which is what the CPU can check.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

GROUP = 128
# Reduction slot k of a group = 64 t1 + 32 t0 + 16 i1 + 8 i0 + 4 c1 + 2 c0 + h holds word 4c + t, nibble
# i + 4h (i = 2 i1 + i0): feature 32c + 8t + 4h + 2 i1 + i0. The tile [rows, c1 c0 t1 t0, h i1 i0] and the
# activations [c1 c0 t1 t0 h i1 i0], split into bits, permuted to the slots' order:
A_ORDER = (0, 3, 4, 6, 7, 1, 2, 5)
X_ORDER = (2, 3, 5, 6, 0, 1, 4)
_A_ORDER = gl.constexpr(A_ORDER)
_X_ORDER = gl.constexpr(X_ORDER)
_DEQUANT = "{ .reg .b32 t; shr.u32 t, $1, $3; lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 $0, t, $5; }"


class Layouts(NamedTuple):
    mma: Any
    a: Any  # the weights, first operand
    b: Any  # the activations, second operand
    x: Any  # one group's activations as read: lane c holds features 32c .. 32c + 31
    tile: Any  # [block_n, 16 words, 8 nibbles], each element where its operand slot lives
    words: Any  # [block_n, 16 words]: lane c holds words 4c .. 4c + 3 of its rows


def layouts(block_n: int, warps: int) -> Layouts:
    """The layouts of ``block_n`` rows over ``warps`` warps (``block_n`` a multiple of 16 * ``warps``)."""
    if block_n % (16 * warps) or block_n & (block_n - 1) or warps & (warps - 1):
        raise ValueError(f"block_n must be a power-of-two multiple of 16 x warps ({16 * warps}), got {block_n}")
    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[warps, 1], instr_shape=[16, 8])
    repeats = [[16 * warps << r, 0, 0] for r in range((block_n // (16 * warps)).bit_length() - 1)]
    warp_rows = [[16 << w, 0, 0] for w in range(warps.bit_length() - 1)]
    lanes = [[0, 4, 0], [0, 8, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    tile = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 4], [8, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 2, 0], *repeats],
        lane_bases=lanes,
        warp_bases=warp_rows,
        block_bases=[],
        shape=[block_n, 16, 8],
    )
    words = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0], *(r[:2] for r in repeats)],
        lane_bases=[lane[:2] for lane in lanes],
        warp_bases=[w[:2] for w in warp_rows],
        block_bases=[],
        shape=[block_n, 16],
    )
    x = gl.DistributedLinearLayout(
        reg_bases=[[1], [2], [4], [8], [16]],
        lane_bases=[[32], [64], [0], [0], [0]],
        warp_bases=[[0]] * len(warp_rows),
        block_bases=[],
        shape=[GROUP],
    )
    return Layouts(
        mma,
        gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2),
        gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2),
        x,
        tile,
        words,
    )


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
    nibble = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, TILE)))
    shift = gl.expand_dims(gl.expand_dims((nibble & 3) * 4, 0), 0)  # a pair's low nibble, i = nibble & 3
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
        words = gl.convert_layout(words, gl.SliceLayout(2, TILE))
        offset = gl.expand_dims(gl.expand_dims((zero.to(gl.float32) + 128.0).to(gl.bfloat16), 1), 2)
        w3, s3 = gl.broadcast(gl.expand_dims(words, 2), shift)
        w3, o3 = gl.broadcast(w3, offset)
        # pack=2 hands the asm the register pair (nibble i, i + 4) of one word: the tile's first register basis
        pairs = gl.inline_asm_elementwise(DEQUANT, "=r,r,r,r,r,r", [w3, s3, o3], gl.bfloat16, True, 2)
        a = gl.reshape(gl.permute(gl.reshape(pairs, [BLOCK_N, 2, 2, 2, 2, 2, 2, 2]), _A_ORDER.value), [BLOCK_N, GROUP])
        a = gl.convert_layout(a, A, assert_trivial=True)
        xv = gl.reshape(gl.permute(gl.reshape(xv, [2, 2, 2, 2, 2, 2, 2]), _X_ORDER.value), [GROUP])
        xv = gl.convert_layout(xv, gl.SliceLayout(1, B))
        xb = gl.broadcast(gl.expand_dims(xv, 1), gl.full([1, 8], 0.0, gl.bfloat16, B))[0]
        part = mma_v2(a, xb, gl.zeros([BLOCK_N, 8], gl.float32, MMA))
        total += part * scale.to(gl.float32)[:, None]
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
        MMA=lay.mma,
        A=lay.a,
        B=lay.b,
        X=lay.x,
        TILE=lay.tile,
        WORDS=lay.words,
        DEQUANT=_DEQUANT,
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
    """The launch at ``n`` x ``k``, on CPU tensors, for ``benchmarks.kernel_sass`` to compile."""
    from benchmarks.kernel_sass import Launch

    words = torch.zeros(n, k // 8, dtype=torch.int32)
    scales = torch.zeros(n, k // GROUP, dtype=torch.bfloat16)
    zeros = torch.zeros(n, k // GROUP, dtype=torch.uint8)
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    parts = torch.zeros(split, n, dtype=torch.float32)
    args, kwargs = _arguments(x, words, scales, zeros, parts, block_n, warps, split, prefetch, 0)
    return Launch(_fragments_kernel, args, kwargs)


def twin(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """``[1, N]``: the kernel's arithmetic in float64 torch, group by group in the operands' reduction order."""
    n, k = words.shape[0], words.shape[1] * 8
    shifts = torch.arange(8, device=words.device) * 4
    q = (words.long()[:, :, None] >> shifts) & 15  # [N, K / 8, 8]: nibble i of word j
    out = torch.zeros(n, dtype=torch.float64, device=words.device)
    for g in range(k // GROUP):
        tile = (q[:, g * 16 : (g + 1) * 16] - zeros[:, g, None, None].long()).double()
        a = tile.reshape(n, *[2] * 7).permute(A_ORDER).reshape(n, GROUP)
        xg = x[0, g * GROUP : (g + 1) * GROUP].double().reshape(*[2] * 7).permute(X_ORDER).reshape(GROUP)
        out += (a @ xg) * scales[:, g].double()
    return out[None, :]
