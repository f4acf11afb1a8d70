"""One row of int4 (batch-1 decode) on the tensor cores, with each thread's words de-quantized straight into
its own ``mma`` fragment (Gluon, explicit layouts; sm_90+), and the decode fusions of kernels/row_fusion.py.

``mma.m16n8k16`` gives lane ``l`` the weight rows ``l / 4`` and ``l / 4 + 8`` and the reduction slots
``2c, 2c + 1, 2c + 8, 2c + 9`` of each 16 (``c = l % 4``), a pair to a 32-bit register. The reduction order
is free, so the kernel picks it to fit the words: lane ``c`` of a row reads the row's words ``4c .. 4c + 3``
of the group (16 contiguous bytes), and the pair in one register is nibbles ``i`` and ``i + 4`` of one word,
``(w >> 4i) & 0x000F000F | 0x43004300``: two bfloat16 ``128 + q``, less ``128 + zero`` in one packed
subtraction, so the operand holds ``q - zero`` exactly. Three instructions a pair; no shared memory, no
shuffle (the conversion into the operand's layout is asserted trivial). The activations are the second
operand, one column repeated over the eight: lane ``c`` reads the 32 activations of its words (64 contiguous
bytes) and pairs them the same way. Each group's sums leave the tensor cores in float32, times its scale.
Compiled for sm_90 the loop issues 2.45 instructions a weight at the shipped 32 rows and 2 warps (3.0 with
the norm weight applied in the loop; 2.2 at 128 rows and 4 warps), against 3.8 for the CUDA-core planes of
kernels/quant_tiles.py.

The words come in 64-row tiles (``quant_reference.tile_int4``): a program's rows of one group are one
contiguous run. Programs own 32 rows (16 gate and 16 up rows, gated) and split the groups (``split_for``);
each writes float32 partial sums, and the last to finish (an atomic counter per row block, shared with
kernels/quant_gemv.py's) adds them and runs the epilogue (kernels/int4_row_epilogue.py), or each adds its
sums into a float32 row (kernels/int4_row_stream.py).

An RMSNorm before the linear runs in the loop, each group's activations times the norm weight, each split's
sum of squares written beside its partial sums and the last program adding those up for the row's scale; or,
reading the float32 stream, in the staging before the loop.
``A_ORDER`` and ``X_ORDER`` are that reduction order, applied to the ``[rows, word, nibble]`` tile and to the
group's activations; ``twin`` runs them in torch, which is what the CPU can check.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite, split_tail
from omni_gateway.kernels.int4_row_stream import (
    SOURCE_GATE,
    SOURCE_ROW,
    SOURCE_STREAM,
    GateSums,
    StreamRow,
    add_into,
    check_launch,
    stage,
)
from omni_gateway.kernels.validation import next_pow2
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

GROUP = 128
ROW_TILE = 64  # rows a tile of words holds; the kernel reads only this layout
BLOCK_N = 32  # rows a program owns
WARPS = 2
MAX_SPLIT = 8
MAX_LONG_SPLIT = 16
MIN_LONG_GROUPS = 4
UNSPLIT_BLOCKS = 2048
ADD_PROGRAMS = 4096
MIN_ADD_GROUPS = 2
# Reduction slot k of a group = 64 t1 + 32 t0 + 16 i1 + 8 i0 + 4 c1 + 2 c0 + h holds word 4c + t, nibble
# i + 4h (i = 2 i1 + i0): feature 32c + 8t + 4h + 2 i1 + i0. The tile [rows, c1 c0 t1 t0, h i1 i0] and the
# activations [c1 c0 t1 t0 h i1 i0], split into bits, permuted to the slots' order:
A_ORDER = (0, 3, 4, 6, 7, 1, 2, 5)
X_ORDER = (2, 3, 5, 6, 0, 1, 4)
_A_ORDER = gl.constexpr(A_ORDER)
_X_ORDER = gl.constexpr(X_ORDER)
_GROUP = gl.constexpr(GROUP)
_ROW_TILE = gl.constexpr(ROW_TILE)
DEQUANT = "{ .reg .b32 t; shr.u32 t, $1, $3; lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 $0, t, $5; }"


class Layouts(NamedTuple):
    mma: Any
    a: Any  # the weights, first operand
    b: Any  # the activations, second operand
    x: Any  # one group's activations as read: lane c holds features 32c .. 32c + 31
    tile: Any  # [block_n, 16 words, 8 nibbles], each element where its operand slot lives
    words: Any  # [block_n, 16 words]: lane c holds words 4c .. 4c + 3 of its rows
    flat: Any  # one value a thread, for the epilogue

    def loop_kwargs(self) -> dict[str, Any]:
        """The layouts a kernel's group loop takes (``group_product``), by their constexpr names."""
        return dict(MMA=self.mma, A=self.a, B=self.b, X=self.x, TILE=self.tile, WORDS=self.words)


@functools.cache
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
        gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[warps], order=[0]),
    )


@gluon.jit
def _rows(
    pid,
    N,
    layout: gl.constexpr,
    BLOCK_N: gl.constexpr,
    GATED: gl.constexpr,
    ROTARY: gl.constexpr,
    HEAD_DIM: gl.constexpr,
):
    """The weight rows a program reads; gated, its first half are gate rows ``f``, the second the up rows
    ``N / 2 + f`` of the same features (kernels/row_fusion.py ``row_columns``); rotary, features ``d`` and
    ``d + HEAD_DIM / 2`` of one head, the pairs that rotate together."""
    r = gl.arange(0, BLOCK_N, layout=layout)
    half: gl.constexpr = BLOCK_N // 2
    if GATED:
        return pid * half + r % half + (r // half) * (N // 2)
    if ROTARY:
        per_head: gl.constexpr = HEAD_DIM // BLOCK_N
        return (pid // per_head) * HEAD_DIM + (pid % per_head) * half + r % half + (r // half) * (HEAD_DIM // 2)
    return pid * BLOCK_N + r


@gluon.jit
def group_product(
    words,
    xv,
    zero,
    scale,
    total,
    MMA: gl.constexpr,
    A: gl.constexpr,
    B: gl.constexpr,
    TILE: gl.constexpr,
    DEQUANT_ASM: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """``total`` [BLOCK_N, 8] plus one group's product: ``words`` [BLOCK_N, 16] as loaded, the group's
    bfloat16 activations ``xv`` [128] (layout ``X``), its zero points and scales [BLOCK_N]."""
    nibble = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, TILE)))
    shift = gl.expand_dims(gl.expand_dims((nibble & 3) * 4, 0), 0)  # a pair's low nibble, i = nibble & 3
    words = gl.convert_layout(words, gl.SliceLayout(2, TILE))
    offset = gl.expand_dims(gl.expand_dims((zero.to(gl.float32) + 128.0).to(gl.bfloat16), 1), 2)
    w3, s3 = gl.broadcast(gl.expand_dims(words, 2), shift)
    w3, o3 = gl.broadcast(w3, offset)
    # pack=2 hands the asm the register pair (nibble i, i + 4) of one word: the tile's first register basis
    pairs = gl.inline_asm_elementwise(DEQUANT_ASM, "=r,r,r,r,r,r", [w3, s3, o3], gl.bfloat16, True, 2)
    a = gl.reshape(gl.permute(gl.reshape(pairs, [BLOCK_N, 2, 2, 2, 2, 2, 2, 2]), _A_ORDER.value), [BLOCK_N, _GROUP])
    a = gl.convert_layout(a, A, assert_trivial=True)
    xv = gl.reshape(gl.permute(gl.reshape(xv, [2, 2, 2, 2, 2, 2, 2]), _X_ORDER.value), [_GROUP])
    xv = gl.convert_layout(xv, gl.SliceLayout(1, B))
    xb = gl.broadcast(gl.expand_dims(xv, 1), gl.full([1, 8], 0.0, gl.bfloat16, B))[0]
    part = mma_v2(a, xb, gl.zeros([BLOCK_N, 8], gl.float32, MMA))
    return total + part * scale.to(gl.float32)[:, None]


@gluon.jit
def _fragments_kernel(
    w_ptr,
    x_ptr,
    s_ptr,
    z_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    lock_ptr,
    norm_ptr,
    res_ptr,
    sq_ptr,
    pos_ptr,
    table_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    N,
    K,
    eps,
    width,
    MMA: gl.constexpr,
    A: gl.constexpr,
    B: gl.constexpr,
    X: gl.constexpr,
    TILE: gl.constexpr,
    WORDS: gl.constexpr,
    FLAT: gl.constexpr,
    DEQUANT_ASM: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SPLIT: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    NORM: gl.constexpr,
    RESIDUAL: gl.constexpr,
    GATED: gl.constexpr,
    ROTARY: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    NUM_Q_HEADS: gl.constexpr,
    NUM_KV_HEADS: gl.constexpr,
    SOURCE: gl.constexpr,
    STAGE_GROUPS: gl.constexpr,
    ACCUMULATE: gl.constexpr,
    WARPS: gl.constexpr,
):
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    groups = K // _GROUP
    rows_w = _rows(pid_n, N, gl.SliceLayout(1, WORDS), BLOCK_N, GATED, ROTARY, HEAD_DIM)
    word = gl.arange(0, 16, layout=gl.SliceLayout(0, WORDS))
    tile = (rows_w // _ROW_TILE).to(gl.int64) * groups * _ROW_TILE + rows_w % _ROW_TILE
    w_ptrs = w_ptr + tile[:, None] * 16 + word[None, :]
    x_ptrs = x_ptr + gl.arange(0, _GROUP, layout=X)
    g_ptrs = norm_ptr + gl.arange(0, _GROUP, layout=X)
    rows_z = _rows(pid_n, N, gl.SliceLayout(1, gl.SliceLayout(2, TILE)), BLOCK_N, GATED, ROTARY, HEAD_DIM)
    z_ptrs = z_ptr + rows_z * groups
    rows = _rows(pid_n, N, gl.SliceLayout(1, MMA), BLOCK_N, GATED, ROTARY, HEAD_DIM)
    s_ptrs = s_ptr + rows * groups
    total = gl.zeros([BLOCK_N, 8], gl.float32, MMA)
    squares = gl.zeros([_GROUP], gl.float32, FLAT)  # of the split's activations, for the norm
    sq_ptrs = x_ptr + gl.arange(0, _GROUP, layout=FLAT)
    per_split = groups // SPLIT
    first = pid_k * per_split
    square_sum = 0.0
    if SOURCE != SOURCE_ROW:
        staged, square_sum = stage(
            x_ptr, norm_ptr, sq_ptr, first, per_split, K, eps, width, SOURCE, STAGE_GROUPS, WARPS
        )
    for g in range(first, first + per_split):
        words = gl.load(w_ptrs + gl.multiple_of(g * (16 * _ROW_TILE), 16), eviction_policy="evict_first")
        if SOURCE == SOURCE_ROW:
            xv = gl.load(x_ptrs + g * _GROUP)
            if NORM:  # the norm weight here, its per-row scale in the epilogue
                xv = (xv.to(gl.float32) * gl.load(g_ptrs + g * _GROUP).to(gl.float32)).to(gl.bfloat16)
                xs = gl.load(sq_ptrs + g * _GROUP).to(gl.float32)
                squares += xs * xs
        else:
            xv = staged.index(g - first).load(X)
        zero = gl.load(z_ptrs + g)
        scale = gl.load(s_ptrs + g)
        total = group_product(words, xv, zero, scale, total, MMA, A, B, TILE, DEQUANT_ASM, BLOCK_N)
    if SOURCE == SOURCE_ROW and NORM:
        square_sum = gl.sum(squares, 0)
    # the eight columns are equal: column 0 holds the row's sums
    column = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    if ACCUMULATE:
        add_into(out_ptr, sq_ptr, total, square_sum, rows, column, pid_n, NORM)
    else:
        split_tail(
            bias_ptr, out_ptr, part_ptr, lock_ptr, res_ptr, pos_ptr, table_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
            total, square_sum, rows, column, pid_n, pid_k, N, K, eps, FLAT, SPLIT, NORM, HAS_BIAS, RESIDUAL,
            GATED, ROTARY, HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS, BLOCK_N,
        )  # fmt: skip


def takes(packed: torch.Tensor, group: int) -> bool:
    """Whether ``launch`` reads this int4 weight: on sm_90+, groups of 128, words in ``ROW_TILE``-row tiles.
    Whole tiles make whole programs: ``BLOCK_N`` divides ``ROW_TILE``, and gated, ``BLOCK_N / 2`` divides
    ``N / 2``."""
    if packed.device.type != "cuda" or group != GROUP:
        return False
    return packed.dim() == 4 and packed.shape[2] == ROW_TILE and _sm90(packed.device)


def supported(x: torch.Tensor | StreamRow | GateSums, packed: torch.Tensor, group: int) -> bool:
    """Whether ``launch`` takes this one-row product (``takes``): bfloat16 activations, as a bfloat16 row on
    the weight's device or a float32 row of kernels/int4_row_stream.py."""
    if isinstance(x, torch.Tensor) and (x.dtype != torch.bfloat16 or x.device != packed.device):
        return False
    return takes(packed, group)


@functools.cache
def _sm90(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def split_for(groups: int, blocks: int) -> int:
    """How many ways a launch of ``blocks`` row blocks splits its ``groups``: not at all where the row blocks
    alone fill the GPU many times over (``UNSPLIT_BLOCKS``: the 8B LM head's 4,008 took 115 us a token
    unsplit, 128 split 8 ways); else up to ``MAX_SPLIT``, dividing them evenly, and long rows up to
    ``MAX_LONG_SPLIT`` while each split keeps ``MIN_LONG_GROUPS`` groups (the down projection's 112 groups run
    16 ways: 2,048 programs at the 8B shape, where 8 ways leave the SMs half full)."""
    if blocks >= UNSPLIT_BLOCKS:
        return 1
    long = [s for s in range(MAX_SPLIT + 1, MAX_LONG_SPLIT + 1) if groups % s == 0 and groups // s >= MIN_LONG_GROUPS]
    return max(long) if long else max(s for s in range(1, MAX_SPLIT + 1) if groups % s == 0)


def add_split_for(groups: int, blocks: int) -> int:
    """How many ways a launch that adds into a float32 row (kernels/int4_row_stream.py) splits its ``groups``:
    with no split tail to pay, finer than ``split_for``: the most that divide them evenly, keep
    ``MIN_ADD_GROUPS`` each and ``ADD_PROGRAMS`` programs in all, and at least ``MAX_SPLIT`` where the groups
    allow. On an H100 at the 8B shapes: o (128 blocks, 32 groups) 4.9 us at 16 splits against 5.6 at 8; down
    (128 blocks, 112 groups) 14.0 at 28 against 14.9 at 16; gate/up (896 blocks) 23.2 at 8 against 23.5 at 4."""
    most = max(MAX_SPLIT, ADD_PROGRAMS // max(1, blocks))
    fits = [s for s in range(1, most + 1) if groups % s == 0 and groups // s >= MIN_ADD_GROUPS]
    return max(fits) if fits else 1


def launch(
    x: torch.Tensor | StreamRow | GateSums,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | StreamRow | GateSums,
    locks: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None,
    gated: bool,
    rotary: RotaryWrite | None = None,
) -> None:
    """Writes ``out`` ([1, N], or [1, N / 2] gated) for one row ``x`` against the tiled int4 weight ``packed``
    ([N / 64, K / 128, 64, 64] uint8, ``supported``) with its ``scales`` and ``zeros`` [N, K / 128]; operands
    validated by the caller (kernels/quant_linear.py). Without ``locks`` (split-K counters,
    kernels/quant_gemv.py) the reduction runs unsplit.

    ``x`` is a bfloat16 row [1, K], or from kernels/int4_row_stream.py the float32 residual stream
    (``StreamRow``, read through the norm ``norm_weight``) or ``GateSums`` (finished into the MLP's activation).
    With ``rotary`` (``RotaryWrite.fits``, not gated, no residual) ``out``'s first ``num_q_heads`` heads hold
    the rotated q, and the token's k and v go to the caches only. An ``out`` of that module adds each split's
    sums into it instead: the stream (no norm, bias, residual or rotary), or gated and normed, zeroed
    ``GateSums`` (the norm's scale left to their reader)."""
    n, k = scales.shape[0], scales.shape[1] * GROUP
    accumulate = not isinstance(out, torch.Tensor)
    split = (add_split_for if accumulate else split_for)(k // GROUP, n // BLOCK_N) if locks is not None else 1
    lay = layouts(BLOCK_N, WARPS)
    source = SOURCE_GATE if isinstance(x, GateSums) else SOURCE_STREAM if isinstance(x, StreamRow) else SOURCE_ROW
    check_launch(source, out, n, BLOCK_N, norm_weight, bias, residual, gated, rotary)
    # each split's partial sums [N], then each split's sums of squares [N / BLOCK_N]
    parts = torch.empty(split * (n + n // BLOCK_N), device=packed.device, dtype=torch.float32)
    squares = x.squares if isinstance(x, GateSums) else out.squares if isinstance(out, GateSums) else parts
    row = x if isinstance(x, torch.Tensor) else x[0]  # the tensor of a StreamRow or GateSums
    # gated, a program's rows are half gate and half up: N / BLOCK_N programs either way
    _fragments_kernel[(n // BLOCK_N, split)](
        packed.view(torch.int32),
        row,
        scales,
        zeros,
        row if bias is None else bias,
        out if isinstance(out, torch.Tensor) else out[0],
        parts,
        parts if locks is None else locks,
        row if norm_weight is None else norm_weight,
        row if residual is None else residual,
        squares,
        *(
            (parts, parts, parts, parts, parts)
            if rotary is None
            else (rotary.positions, rotary.cos_sin_cache, rotary.k_cache, rotary.v_cache, rotary.slot_mapping)
        ),
        n,
        k,
        x.eps if isinstance(x, GateSums) else eps,
        x.width if isinstance(x, GateSums) else 1,
        **lay.loop_kwargs(),
        FLAT=lay.flat,
        DEQUANT_ASM=DEQUANT,
        BLOCK_N=BLOCK_N,
        SPLIT=split,
        HAS_BIAS=bias is not None,
        NORM=norm_weight is not None,
        RESIDUAL=residual is not None,
        GATED=gated and not accumulate,  # accumulating, the gate and up sums land in their own rows
        ROTARY=rotary is not None,
        HEAD_DIM=1 if rotary is None else rotary.head_dim,
        NUM_Q_HEADS=1 if rotary is None else rotary.num_q_heads,
        NUM_KV_HEADS=1 if rotary is None else rotary.num_kv_heads,
        SOURCE=source,
        STAGE_GROUPS=max(2, next_pow2(k // GROUP // split)),
        ACCUMULATE=accumulate,
        WARPS=WARPS,
        num_warps=WARPS,
    )


def twin(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """``[1, N]``: the kernel's arithmetic in float64 torch, group by group in the operands' reduction order,
    for int32 ``words`` [N, K / 8] in the row layout (nibble i of word j is feature 8j + i)."""
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
