"""How a program of kernels/int4_fragments.py ends once it has its float32 sums: either every split writes
its partial sums and the last to finish (an atomic counter per row block) adds them up and writes the output
(the RMSNorm's row scale, bias, and a residual add, the gate, or q rotated and k and v cached), or
(kernels/int4_row_stream.py) each split adds its sums straight into a float32 row. In Gluon, with one value a
thread in ``FLAT``; and, as ``RotaryWrite``, what a qkv projection hands its epilogue."""

from __future__ import annotations

from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# Every thread's partial sums must be stored before its program's counter moves; the barrier's name
# changed between Triton releases.
barrier = getattr(gl, "barrier", None) or gl.thread_barrier


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

    def fits(self, dtype: torch.dtype, n: int, block_n: int) -> bool:
        """Whether the epilogue can run it for an ``n``-row qkv weight in programs of ``block_n`` rows writing
        ``dtype``: whole heads of a multiple of ``block_n`` features, caches in that dtype."""
        d = self.head_dim
        return (
            d % block_n == 0
            and n == (self.num_q_heads + 2 * self.num_kv_heads) * d
            and self.k_cache.dtype == self.v_cache.dtype == dtype
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
def split_tail(
    bias_ptr, out_ptr, part_ptr, lock_ptr, res_ptr, pos_ptr, table_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    total, square_sum, rows, column, pid_n, pid_k, N, K, eps, FLAT: gl.constexpr, SPLIT: gl.constexpr,
    NORM: gl.constexpr, HAS_BIAS: gl.constexpr, RESIDUAL: gl.constexpr, GATED: gl.constexpr,
    ROTARY: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_Q_HEADS: gl.constexpr, NUM_KV_HEADS: gl.constexpr,
    BLOCK_N: gl.constexpr,
):  # fmt: skip
    """Store this split's sums ``total`` [BLOCK_N, 8] (column 0 holds them) and its sum of squares; the last
    split of the row block to finish adds them all up and writes the output."""
    gl.store(part_ptr + pid_k * N + rows[:, None] + column[None, :] * 0, total, mask=column[None, :] == 0)
    # Each split's sum of squares goes beside its partial sums, so that the last program's norm is SPLIT
    # loads, not a second pass over the row.
    n_blocks = gl.num_programs(0)
    sq_ptr = part_ptr + SPLIT * N
    if NORM and SPLIT > 1:
        gl.store(sq_ptr + pid_k * n_blocks + pid_n, square_sum)
    barrier()  # every thread's partial sums precede the counter's release (or, unsplit, the epilogue's reads)
    last = True
    if SPLIT > 1:
        last = gl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1
    if last:
        if SPLIT > 1:
            gl.atomic_xchg(lock_ptr + pid_n, 0)  # ready for the next launch
        norm_scale = 1.0
        if NORM:  # RMSNorm's rsqrt(mean(x^2) + eps) over the whole row, from each split's sum of squares
            if SPLIT > 1:
                square_sum = _sum_parts(sq_ptr, pid_n, n_blocks, SPLIT)
            norm_scale = gl.rsqrt(square_sum / K + eps)
        if ROTARY:
            rotary_epilogue(
                bias_ptr, out_ptr, part_ptr, norm_scale, pos_ptr, table_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                pid_n, N, FLAT, BLOCK_N, SPLIT, HAS_BIAS, HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS,
            )  # fmt: skip
        else:
            epilogue(
                bias_ptr, out_ptr, part_ptr, norm_scale, res_ptr, pid_n, N, FLAT, BLOCK_N, SPLIT, HAS_BIAS, RESIDUAL,
                GATED,
            )  # fmt: skip


@gluon.jit
def epilogue(
    bias_ptr,
    out_ptr,
    part_ptr,
    norm_scale,
    res_ptr,
    pid,
    N,
    FLAT: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SPLIT: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    RESIDUAL: gl.constexpr,
    GATED: gl.constexpr,
):
    act: gl.constexpr = gl.bfloat16  # the kernel's activations, whatever the output's dtype
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
    act: gl.constexpr = gl.bfloat16
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
