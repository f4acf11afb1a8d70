"""The batch-1 decode's residual stream as a float32 row that the int4 linears of kernels/int4_fragments.py add
their sums into, each split on its own (``red.add``), with no split tail: no partial sums, no fence, no counter
and no last program. The o and down projections add into the stream itself (``StreamRow``: the residual add), the
gate/up projection into ``GateSums``; whatever a linear's tail did moves to the program that reads its output, which
computes its activations once, into shared memory, before its loop (``stage``):

- a normed linear reading the stream (the qkv and gate/up projections, the LM head) stages the stream times
  the norm weight, rounded to bfloat16, and sums the squares of its features for the row's scale;
- the down projection stages the MLP's activation from the gate and up sums, times the scale of the norm
  before them (from ``GateSums.squares``, which the gate/up projection summed), rounded as the unfused layer
  rounds: ``silu(bf16(s g)) bf16(s u)``.

On one H100 the four linears of an 8B layer took 51.7 us a token this way, against 64.1 as bfloat16 rows with
split tails (docs/kernels.md, "What the experiments measured").
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite, barrier
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# Where a program's activations come from: a bfloat16 row read group by group in the loop, or staged once
# from the float32 stream (normed) or from gate and up sums.
SOURCE_ROW, SOURCE_STREAM, SOURCE_GATE = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)
_GROUP = gl.constexpr(128)


class StreamRow(NamedTuple):
    """The float32 residual stream ``row`` [1, hidden] of a batch-1 decode of bfloat16 activations: what the
    o and down projections add into and the normed linears read."""

    row: torch.Tensor


class GateSums(NamedTuple):
    """What a gate/up projection adds up for the down projection to finish: ``sums`` [1, 2 I], the unscaled
    float32 sums of the gate rows then the up rows; ``squares`` [1], the sum of squares of the stream they
    were taken from, over its ``width`` features, for the norm's scale ``rsqrt(squares / width + eps)``. Both
    zeroed before the gate/up projection runs (``zeros``)."""

    sums: torch.Tensor
    squares: torch.Tensor
    width: int
    eps: float

    @classmethod
    def zeros(cls, count: int, features: int, width: int, eps: float, device: torch.device) -> list[GateSums]:
        """Zeroed sums for ``count`` gate/up projections (a model's layers) of ``features`` gate (and as many
        up) rows over ``width``: one buffer, so one fill a decode step."""
        # each layer's sums start on a 128-byte line, as the kernel's vector loads assume
        space = torch.zeros(count, 2 * features + 32, dtype=torch.float32, device=device)
        return [cls(row[None, : 2 * features], row[2 * features : 2 * features + 1], width, eps) for row in space]


def check_launch(
    source: int,
    out: torch.Tensor | StreamRow | GateSums,
    n: int,
    block_n: int,
    norm_weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    gated: bool,
    rotary: RotaryWrite | None,
) -> None:
    """Refuse the combinations kernels/int4_fragments.py ``launch`` has no kernel for (``source`` one of the
    ``SOURCE_*``, programs of ``block_n`` rows), naming what each needs."""
    normed = norm_weight is not None
    if source == SOURCE_STREAM and not normed:
        raise ValueError("int4 fragments: the float32 stream is read through its norm; got no norm_weight")
    if source == SOURCE_GATE and normed:
        raise ValueError("int4 fragments: GateSums carry their own norm's scale; got a norm_weight too")
    if isinstance(out, torch.Tensor):
        if rotary is not None and (gated or residual is not None or not rotary.fits(out.dtype, n, block_n)):
            raise ValueError(
                f"int4 fragments: rotary needs an ungated qkv projection of whole {block_n}-multiple heads "
                f"({rotary.num_q_heads} q + 2 x {rotary.num_kv_heads} kv heads of {rotary.head_dim}) with caches "
                f"in the output's dtype, got N={n}, gated={gated}, caches {rotary.k_cache.dtype}"
            )
        return
    if bias is not None or residual is not None or rotary is not None:
        raise ValueError(
            "int4 fragments: adding into a float32 row takes no bias, residual or rotary; got "
            f"bias={bias is not None}, residual={residual is not None}, rotary={rotary is not None}"
        )
    if isinstance(out, GateSums) != gated or normed != gated:
        raise ValueError(
            "int4 fragments: a gated, normed projection adds into GateSums and an ungated one without a norm into "
            f"the stream; got {type(out).__name__} with gated={gated}, norm={normed}"
        )


@gluon.jit
def stage(
    x_ptr,
    norm_ptr,
    sq_ptr,
    first,
    count,
    K,
    eps,
    width,
    SOURCE: gl.constexpr,
    GROUPS: gl.constexpr,
    WARPS: gl.constexpr,
):
    """A split's ``count`` groups from group ``first``, as bfloat16 activations in shared memory [GROUPS, 128],
    and (``SOURCE_STREAM``) the sum of squares of the stream's features they came from."""
    lay: gl.constexpr = gl.BlockedLayout([2], [32], [WARPS], [0])
    staged = gl.allocate_shared_memory(gl.bfloat16, [GROUPS, _GROUP], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    feature = gl.arange(0, _GROUP, layout=lay)
    squares = gl.zeros([_GROUP], gl.float32, lay)
    if SOURCE == SOURCE_GATE:
        scale = gl.rsqrt(gl.load(sq_ptr) / width + eps)  # the norm's, before the gate/up projection
    for i in gl.static_range(GROUPS):  # every group's loads issued at once
        feats = (first + i) * _GROUP + feature
        ok = (feature < _GROUP) & (i < count)
        if SOURCE == SOURCE_STREAM:
            row = gl.load(x_ptr + feats, mask=ok, other=0.0)
            act = (row * gl.load(norm_ptr + feats, mask=ok, other=0.0).to(gl.float32)).to(gl.bfloat16)
            squares += row * row
        else:
            gate = (gl.load(x_ptr + feats, mask=ok, other=0.0) * scale).to(gl.bfloat16).to(gl.float32)
            up = (gl.load(x_ptr + K + feats, mask=ok, other=0.0) * scale).to(gl.bfloat16).to(gl.float32)
            act = (gate / (1.0 + gl.exp(-gate)) * up).to(gl.bfloat16)
        staged.index(i).store(act)
    barrier()
    return staged, gl.sum(squares, 0)


@gluon.jit
def add_into(out_ptr, sq_ptr, total, square_sum, rows, column, pid_n, NORM: gl.constexpr):
    """A split's sums ``total`` [BLOCK_N, 8] (column 0 holds them) added into the float32 row ``out``, and
    normed, the squares of its features into ``sq_ptr`` (once: by the first row block's splits, which between
    them cover the row)."""
    if NORM:
        if pid_n == 0:
            gl.atomic_add(sq_ptr, square_sum, sem="relaxed")
    gl.atomic_add(out_ptr + rows[:, None] + column[None, :] * 0, total, mask=column[None, :] == 0, sem="relaxed")
