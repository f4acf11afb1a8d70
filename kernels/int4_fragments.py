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
kernels/quant_gemv.py's) adds them and runs the epilogue.

An RMSNorm before the linear runs one of two ways. In the loop: each group's activations times the norm
weight, each split's sum of squares written beside its partial sums, and the last program adding those up
for the row's scale. Or folded into the linear that wrote the row (``NormedRow``): that linear's epilogue
(``next_norm``, the o and down projections of a decode layer) also writes the row times the next norm's
weight and each block's sum of squares, so the reading loop runs as if there were no norm. On an H100 the
fold took the 8B gate/up projection from 32.3 to 26.6 us and the qkv projection from 9.8 to 8.9.
``A_ORDER`` and ``X_ORDER`` are that reduction order, applied to the ``[rows, word, nibble]`` tile and to the
group's activations; ``twin`` runs them in torch, which is what the CPU can check.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
from omni_gateway.kernels.int4_row_epilogue import (
    NORM_GIVEN,
    NORM_IN_LOOP,
    NORM_NONE,
    NormedRow,
    RotaryWrite,
    epilogue,
    rotary_epilogue,
    row_norm,
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
# Every thread's partial sums must be stored before its program's counter moves; the barrier's name
# changed between Triton releases.
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# Benchmarks clear this to time the CUDA-core planes in its place.
ENABLED = True


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
    sq_in_ptr,
    next_ptr,
    scaled_ptr,
    sq_out_ptr,
    pos_ptr,
    table_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    N,
    K,
    eps,
    n_sq,
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
    NEXT_NORM: gl.constexpr,
    SQ_BLOCKS: gl.constexpr,
    ROTARY: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    NUM_Q_HEADS: gl.constexpr,
    NUM_KV_HEADS: gl.constexpr,
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
    for g in range(pid_k * per_split, (pid_k + 1) * per_split):
        words = gl.load(w_ptrs + gl.multiple_of(g * (16 * _ROW_TILE), 16), eviction_policy="evict_first")
        xv = gl.load(x_ptrs + g * _GROUP)
        if NORM == NORM_IN_LOOP:  # the norm weight here, its per-row scale in the epilogue
            xv = (xv.to(gl.float32) * gl.load(g_ptrs + g * _GROUP).to(gl.float32)).to(gl.bfloat16)
            xs = gl.load(sq_ptrs + g * _GROUP).to(gl.float32)
            squares += xs * xs
        zero = gl.load(z_ptrs + g)
        scale = gl.load(s_ptrs + g)
        total = group_product(words, xv, zero, scale, total, MMA, A, B, TILE, DEQUANT_ASM, BLOCK_N)
    # the eight columns are equal: column 0 holds the row's sums
    column = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    gl.store(part_ptr + pid_k * N + rows[:, None] + column[None, :] * 0, total, mask=column[None, :] == 0)
    # Each split's sum of squares goes beside its partial sums, so that the last program's norm is SPLIT
    # loads, not a second pass over the row.
    n_blocks = gl.num_programs(0)
    sq_ptr = part_ptr + SPLIT * N
    square_sum = 0.0
    if NORM == NORM_IN_LOOP:
        square_sum = gl.sum(squares, 0)
        if SPLIT > 1:
            gl.store(sq_ptr + pid_k * n_blocks + pid_n, square_sum)
    _barrier()  # every thread's partial sums precede the counter's release (or, unsplit, the epilogue's reads)
    last = True
    if SPLIT > 1:
        last = gl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1
    if last:
        if SPLIT > 1:
            gl.atomic_xchg(lock_ptr + pid_n, 0)  # ready for the next launch
        norm_scale = row_norm(
            sq_ptr, square_sum, sq_in_ptr, n_sq, pid_n, n_blocks, K, eps, FLAT, SPLIT, NORM, SQ_BLOCKS
        )
        if ROTARY:
            rotary_epilogue(
                bias_ptr, out_ptr, part_ptr, norm_scale, pos_ptr, table_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                pid_n, N, x_ptr.dtype.element_ty, FLAT, BLOCK_N, SPLIT, HAS_BIAS, HEAD_DIM, NUM_Q_HEADS,
                NUM_KV_HEADS,
            )  # fmt: skip
        else:
            epilogue(
                x_ptr, bias_ptr, out_ptr, part_ptr, norm_scale, res_ptr, next_ptr, scaled_ptr, sq_out_ptr, pid_n,
                N, FLAT, BLOCK_N, SPLIT, HAS_BIAS, RESIDUAL, GATED, NEXT_NORM,
            )  # fmt: skip


def supported(x: torch.Tensor, packed: torch.Tensor, group: int) -> bool:
    """Whether ``launch`` takes this one-row int4 product: bfloat16 activations on sm_90+, groups of 128,
    words in ``ROW_TILE``-row tiles. Whole tiles make whole programs: ``BLOCK_N`` divides ``ROW_TILE``, and
    gated, ``BLOCK_N / 2`` divides ``N / 2``."""
    if not ENABLED or x.device.type != "cuda" or x.dtype != torch.bfloat16 or group != GROUP:
        return False
    return packed.dim() == 4 and packed.shape[2] == ROW_TILE and _sm90(x.device)


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


def launch(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    locks: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None,
    gated: bool,
    squares: torch.Tensor | None = None,
    next_norm: torch.Tensor | None = None,
    rotary: RotaryWrite | None = None,
) -> torch.Tensor | NormedRow:
    """Writes ``out`` ([1, N], or [1, N / 2] gated) for one bfloat16 row ``x`` [1, K] against the tiled int4
    weight ``packed`` ([N / 64, K / 128, 64, 64] uint8, ``supported``) with its ``scales`` and ``zeros``
    [N, K / 128]; operands validated by the caller (kernels/quant_linear.py). Without ``locks`` (split-K
    counters, kernels/quant_gemv.py) the reduction runs unsplit.

    With ``squares`` (a ``NormedRow``'s), ``x`` is already times ``norm_weight`` and only the row's RMS scale
    is applied. With ``next_norm`` (not gated, ``out`` in x's dtype) it returns ``NormedRow(out, ...)`` for
    the linear normed by ``next_norm`` that reads ``out`` next. With ``rotary`` (``RotaryWrite.fits``, not
    gated, no residual) ``out``'s first ``num_q_heads`` heads hold the rotated q, and the token's k and v go
    to the caches only."""
    n, k = scales.shape[0], scales.shape[1] * GROUP
    split = split_for(k // GROUP, n // BLOCK_N) if locks is not None else 1
    lay = layouts(BLOCK_N, WARPS)
    if next_norm is not None and (gated or out.dtype != x.dtype or n % BLOCK_N):
        raise ValueError(
            f"int4 fragments: next_norm needs an ungated output in the activations' dtype ({x.dtype}) and "
            f"N a multiple of {BLOCK_N}, got gated={gated}, {out.dtype}, N={n}"
        )
    if rotary is not None and (
        gated or residual is not None or next_norm is not None or not rotary.fits(x, n, BLOCK_N)
    ):
        raise ValueError(
            f"int4 fragments: rotary needs an ungated qkv projection of whole {BLOCK_N}-multiple heads "
            f"({rotary.num_q_heads} q + 2 x {rotary.num_kv_heads} kv heads of {rotary.head_dim}) with caches in "
            f"{x.dtype}, got N={n}, gated={gated}, caches {rotary.k_cache.dtype}"
        )
    normed = None
    if next_norm is not None:
        normed = NormedRow(out, torch.empty_like(out), torch.empty(n // BLOCK_N, device=x.device), next_norm)
    norm = NORM_NONE if norm_weight is None else NORM_GIVEN if squares is not None else NORM_IN_LOOP
    # each split's partial sums [N], then each split's sums of squares [N / BLOCK_N]
    parts = torch.empty(split * (n + n // BLOCK_N), device=x.device, dtype=torch.float32)
    # gated, a program's rows are half gate and half up: N / BLOCK_N programs either way
    _fragments_kernel[(n // BLOCK_N, split)](
        packed.view(torch.int32),
        x,
        scales,
        zeros,
        x if bias is None else bias,
        out,
        parts,
        parts if locks is None else locks,
        x if norm_weight is None else norm_weight,
        x if residual is None else residual,
        parts if squares is None else squares,
        x if next_norm is None else next_norm,
        x if normed is None else normed.scaled,
        parts if normed is None else normed.squares,
        *(
            (parts, parts, parts, parts, parts)
            if rotary is None
            else (rotary.positions, rotary.cos_sin_cache, rotary.k_cache, rotary.v_cache, rotary.slot_mapping)
        ),
        n,
        k,
        eps,
        1 if squares is None else squares.numel(),
        **lay.loop_kwargs(),
        FLAT=lay.flat,
        DEQUANT_ASM=DEQUANT,
        BLOCK_N=BLOCK_N,
        SPLIT=split,
        HAS_BIAS=bias is not None,
        NORM=norm.value,
        RESIDUAL=residual is not None,
        GATED=gated,
        NEXT_NORM=next_norm is not None,
        SQ_BLOCKS=1 if squares is None else max(2, next_pow2(squares.numel())),
        ROTARY=rotary is not None,
        HEAD_DIM=1 if rotary is None else rotary.head_dim,
        NUM_Q_HEADS=1 if rotary is None else rotary.num_q_heads,
        NUM_KV_HEADS=1 if rotary is None else rotary.num_kv_heads,
        num_warps=WARPS,
    )
    return out if normed is None else normed


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
