"""What the last program of a row block of kernels/int4_fragments.py runs once every split has written its
float32 partial sums: their total, the RMSNorm's row scale, bias, and the fusion that writes the output (a
residual add, the gate, the next norm's input, or q rotated and k and v cached), in Gluon with one value a
thread in ``FLAT``; and, as ``NormedRow`` and ``RotaryWrite``, what the callers hand it for the folds."""

from __future__ import annotations

from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# How the kernel meets an RMSNorm before it: none; the norm weight applied to each group's activations and
# the row's squares summed in the loop; or both done by the linear that wrote the row (``NormedRow``).
NORM_NONE, NORM_IN_LOOP, NORM_GIVEN = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)


class NormedRow(NamedTuple):
    """A row of the residual stream as a linear wrote it for the normed linear after it (``launch`` with
    ``next_norm``): ``hidden`` [1, K]; ``scaled``, hidden times the next norm's weight, rounded to hidden's
    dtype as that linear's own loop would; ``squares``, the float32 sums of hidden^2 over each block of the
    writer's output features. ``scaled`` and ``squares`` are None where the writer could not fold the norm;
    the next linear then normalizes ``hidden`` itself."""

    hidden: torch.Tensor
    scaled: torch.Tensor | None
    squares: torch.Tensor | None
    norm_weight: torch.Tensor

    def given_to(self, norm_weight: torch.Tensor | None) -> bool:
        """Whether this row already carries ``norm_weight``'s scaling and squares."""
        return self.scaled is not None and norm_weight is self.norm_weight


class RotaryWrite(NamedTuple):
    """What a qkv projection's epilogue needs to finish the attention's input itself (kernels/rotary.py
    ``rotary_write_kv``): the token's position [1] and cache slot [1] (int64), the rotary table
    [positions, head_dim], and the paged caches [blocks, page, kv heads, head_dim]."""

    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    num_q_heads: int
    num_kv_heads: int

    @property
    def head_dim(self) -> int:
        return int(self.k_cache.shape[3])

    def fits(self, x: torch.Tensor, n: int, block_n: int) -> bool:
        """Whether the epilogue can run it for activations ``x`` and an ``n``-row qkv weight in programs of
        ``block_n`` rows: whole heads of a multiple of ``block_n`` features, caches in the activations' dtype."""
        d = self.head_dim
        return (
            d % block_n == 0
            and n == (self.num_q_heads + 2 * self.num_kv_heads) * d
            and self.k_cache.dtype == self.v_cache.dtype == x.dtype
            and self.k_cache.is_contiguous()
            and self.v_cache.is_contiguous()
            and self.cos_sin_cache.shape[1] == d
            and self.cos_sin_cache.is_contiguous()
        )


@gluon.jit
def _finish(total, rows, scale, bias_ptr, act: gl.constexpr, HAS_BIAS: gl.constexpr):
    """One output's sums, the norm's scale and bias applied, rounded as the unfused layer would."""
    out = total * scale
    if HAS_BIAS:
        out += gl.load(bias_ptr + rows).to(gl.float32)
    return out.to(act).to(gl.float32)


@gluon.jit
def _sum_parts(part_ptr, rows, N, SPLIT: gl.constexpr):
    """The splits' float32 partials at ``rows`` (each split's ``N`` apart), written by other programs."""
    total = gl.load(part_ptr + rows, cache_modifier=".cg")
    for s in gl.static_range(1, SPLIT):
        total += gl.load(part_ptr + s * N + rows, cache_modifier=".cg")
    return total


@gluon.jit
def epilogue(
    x_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    norm_scale,
    res_ptr,
    next_ptr,
    scaled_ptr,
    sq_out_ptr,
    pid,
    N,
    FLAT: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SPLIT: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    RESIDUAL: gl.constexpr,
    GATED: gl.constexpr,
    NEXT_NORM: gl.constexpr,
):
    act: gl.constexpr = x_ptr.dtype.element_ty
    if GATED:
        feats = pid * (BLOCK_N // 2) + gl.arange(0, BLOCK_N // 2, layout=FLAT)
        gate = _finish(_sum_parts(part_ptr, feats, N, SPLIT), feats, norm_scale, bias_ptr, act, HAS_BIAS)
        up_rows = feats + N // 2
        up = _finish(_sum_parts(part_ptr, up_rows, N, SPLIT), up_rows, norm_scale, bias_ptr, act, HAS_BIAS)
        out = (gate / (1.0 + gl.exp(-gate)) * up).to(act)
        gl.store(out_ptr + feats, out.to(out_ptr.dtype.element_ty))
    else:
        cols = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=FLAT)
        out = _finish(_sum_parts(part_ptr, cols, N, SPLIT), cols, norm_scale, bias_ptr, act, HAS_BIAS)
        if RESIDUAL:
            out = (out + gl.load(res_ptr + cols).to(gl.float32)).to(act).to(gl.float32)
        gl.store(out_ptr + cols, out.to(out_ptr.dtype.element_ty))
        if NEXT_NORM:  # the next linear's activations (rounded as its own loop would) and this block's squares
            gl.store(scaled_ptr + cols, (out * gl.load(next_ptr + cols).to(gl.float32)).to(act))
            gl.store(sq_out_ptr + pid, gl.sum(out * out, 0))


@gluon.jit
def rotary_epilogue(
    bias_ptr,
    out_ptr,
    part_ptr,
    norm_scale,
    pos_ptr,
    table_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    pid,
    N,
    act: gl.constexpr,
    FLAT: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SPLIT: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    NUM_Q_HEADS: gl.constexpr,
    NUM_KV_HEADS: gl.constexpr,
):
    """The qkv projection's outputs, rounded as the unfused layer would, then (kernels/rotary.py
    ``rotary_write_kv``) q rotated into ``out``, k rotated and v as is into the caches' slot (none for a
    padding token's slot -1)."""
    half: gl.constexpr = HEAD_DIM // 2
    head = pid // (HEAD_DIM // BLOCK_N)
    d = (pid % (HEAD_DIM // BLOCK_N)) * (BLOCK_N // 2) + gl.arange(0, BLOCK_N // 2, layout=FLAT)
    first = head * HEAD_DIM + d
    x1 = _finish(_sum_parts(part_ptr, first, N, SPLIT), first, norm_scale, bias_ptr, act, HAS_BIAS)
    x2 = _finish(_sum_parts(part_ptr, first + half, N, SPLIT), first + half, norm_scale, bias_ptr, act, HAS_BIAS)
    if head < NUM_Q_HEADS + NUM_KV_HEADS:  # q and k rotate, v does not
        pos = gl.load(pos_ptr)
        cos = gl.load(table_ptr + pos * HEAD_DIM + d).to(gl.float32)
        sin = gl.load(table_ptr + pos * HEAD_DIM + half + d).to(gl.float32)
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if head < NUM_Q_HEADS:
        gl.store(out_ptr + first, x1.to(out_ptr.dtype.element_ty))
        gl.store(out_ptr + first + half, x2.to(out_ptr.dtype.element_ty))
    else:
        slot = gl.load(slot_ptr)
        if slot >= 0:
            kv_head = (head - NUM_Q_HEADS) % NUM_KV_HEADS
            at = slot * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + d
            if head < NUM_Q_HEADS + NUM_KV_HEADS:
                gl.store(k_cache_ptr + at, x1.to(k_cache_ptr.dtype.element_ty))
                gl.store(k_cache_ptr + at + half, x2.to(k_cache_ptr.dtype.element_ty))
            else:
                gl.store(v_cache_ptr + at, x1.to(v_cache_ptr.dtype.element_ty))
                gl.store(v_cache_ptr + at + half, x2.to(v_cache_ptr.dtype.element_ty))


@gluon.jit
def row_norm(
    sq_ptr,
    squares,
    sq_in_ptr,
    n_sq,
    pid_n,
    n_blocks,
    K,
    eps,
    FLAT: gl.constexpr,
    SPLIT: gl.constexpr,
    NORM: gl.constexpr,
    SQ_BLOCKS: gl.constexpr,
):
    """RMSNorm's ``rsqrt(mean(x^2) + eps)`` over the whole row (1.0 without the norm): from each split's sum
    of squares (``squares`` is this program's own), or, pre-normed, from the ``n_sq`` block sums the linear
    that wrote the row left at ``sq_in_ptr``."""
    if NORM == NORM_IN_LOOP:
        if SPLIT > 1:
            squares = _sum_parts(sq_ptr, pid_n, n_blocks, SPLIT)
        return gl.rsqrt(squares / K + eps)
    if NORM == NORM_GIVEN:
        blocks = gl.arange(0, SQ_BLOCKS, layout=FLAT)
        squares = gl.sum(gl.load(sq_in_ptr + blocks, mask=blocks < n_sq, other=0.0), 0)
        return gl.rsqrt(squares / K + eps)
    return 1.0
