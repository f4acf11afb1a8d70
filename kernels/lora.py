"""Batched LoRA in Triton: every token row with its own adapter, in one launch per product.

``lora_shrink`` computes ``x @ A.T`` into a float32 ``[T, R]`` buffer and ``lora_expand`` adds ``h @ B.T``
into the base projection's output. The adapters sit stacked in preallocated tensors (``a``
``[slots, R, K]``, ``b`` ``[slots, N, R]``, R a power of two >= 16 with each adapter's own rank zero-padded)
and each row's slot comes as an int32 device tensor (-1: no adapter), so a CUDA graph captures the
launches once and replays them whatever adapters the slots hold later.

A shrink program ``(slot, row block, K range)`` handles the rows of its block that use its slot and
returns at once where none does: an adapter's A is read once per row block, not once per row. A decode
step has one row block or a few, and a program walking the whole K (thousands of columns) would run its
dependent steps on one SM while the others idle; so K is split there (``shrink_span``), and each program
adds its partial product into the zeroed float32 output with atomics: the order of those float32 sums, and
so their last bits, varies from run to run. A long prefill's row blocks fill the GPU alone and keep K
whole. An expand program ``(row block, column tile)`` adds the deltas of every adapter its rows use into its
output tile, which it reads and writes once; a block of rows without adapters returns at once.
``kernels.lora_reference`` is the torch twin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_tensor, interpreting

_BLOCK_T = 16
_BLOCK_K = 64
_BLOCK_N = 64
# A shrink's K split: about this many (row block, K range) programs per adapter, about one per SM of a
# large GPU, with K ranges no narrower than _MIN_SPAN columns (narrower, a program's few steps would not
# pay for its launch and its atomics).
_PROGRAMS = 128
_MIN_SPAN = 256


# T (the step's rows) and span (derived from T) unspecialized: a new batch size compiles nothing.
@triton.jit(do_not_specialize=["T", "span"])
def _shrink_kernel(
    x_ptr, a_ptr, slots_ptr, out_ptr, T, stride_x, span,
    K: tl.constexpr, R: tl.constexpr, USED: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):  # fmt: skip
    slot = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_slots = tl.load(slots_ptr + rows, mask=rows < T, other=-1)
    mine = row_slots == slot
    if tl.max(mine.to(tl.int32), axis=0) == 0:
        return
    ranks = tl.arange(0, R)
    a_base = a_ptr + slot.to(tl.int64) * R * K
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    # Told that span is a multiple of BLOCK_K, the compiler keeps the loads of x and a wide and
    # asynchronous; a runtime span is otherwise of unknown alignment and every element loads alone.
    k_lo = tl.multiple_of(tl.program_id(2) * span, BLOCK_K)
    acc = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    for k0 in range(k_lo, tl.minimum(k_lo + span, K), BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        in_k = ks < K
        x = tl.load(x_rows + ks[None, :], mask=mine[:, None] & in_k[None, :], other=0.0)
        # Ranks past USED are padding (zeros): masked, they cost no memory traffic.
        a = tl.load(a_base + ranks[:, None] * K + ks[None, :], mask=(ranks < USED)[:, None] & in_k[None, :], other=0.0)
        if DOT_FP32:
            acc += tl.dot(x.to(tl.float32), tl.trans(a.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(a))
    # The partial sums need no order among themselves: the output is read only after the launch.
    out = out_ptr + rows.to(tl.int64)[:, None] * R + ranks[None, :]
    tl.atomic_add(out, acc, mask=mine[:, None] & (ranks < USED)[None, :], sem="relaxed")


@triton.jit(do_not_specialize=["T"])
def _expand_kernel(
    h_ptr, b_ptr, slots_ptr, y_ptr, T, stride_y, SLOTS,
    N: tl.constexpr, R: tl.constexpr, W: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_slots = tl.load(slots_ptr + rows, mask=rows < T, other=-1)
    if tl.max(row_slots, axis=0) < 0:
        return  # no row of this block has an adapter
    col0 = tl.program_id(1) * BLOCK_N
    part = (col0 >= N1).to(tl.int32) + (col0 >= N2).to(tl.int32)  # the slice (q, k or v; gate or up) of the tile
    ranks = tl.arange(0, R)
    cols = col0 + tl.arange(0, BLOCK_N)
    in_n = cols < N
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * W + part * R + ranks[None, :]
    delta = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    # The adapters of this row block one after another, each over its own rows: the output tile is read
    # and written once, whatever the adapters.
    for slot in range(0, SLOTS):
        mine = row_slots == slot
        if tl.max(mine.to(tl.int32), axis=0) > 0:
            h = tl.load(h_rows, mask=mine[:, None], other=0.0)
            b_tile = b_ptr + slot * (N * R) + cols[:, None] * R + ranks[None, :]  # b.numel() < 2**31
            b = tl.load(b_tile, mask=in_n[:, None], other=0.0)
            h = h.to(b.dtype)  # the matrix unit's operand type, rounded as the twin rounds it
            if DOT_FP32:
                delta += tl.dot(h.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
            else:
                delta += tl.dot(h, tl.trans(b))
    keep = (row_slots >= 0)[:, None] & in_n[None, :]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_y + cols[None, :]
    y = tl.load(y_ptrs, mask=keep, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=keep)


def _dot_fp32(dtype: torch.dtype) -> bool:
    # float32 models get float32 products (tf32 would round the operands to 10 mantissa bits); the
    # interpreter's 16-bit dot is not exact, so it multiplies the rounded operands in float32.
    return dtype == torch.float32 or interpreting()


def _check_slots(slots: torch.Tensor, rows: int, device: torch.device) -> None:
    check_tensor("slots", slots, ndim=1, dtypes=(torch.int32,), device=device)
    if slots.shape[0] != rows:
        raise ValueError(f"slots: expected one slot per row ({rows}), got {slots.shape[0]}")


def _check_rank(name: str, rank: int) -> None:
    if rank < 16 or rank & (rank - 1):
        raise ValueError(f"{name}: expected a padded rank that is a power of two >= 16, got {rank}")


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, used: int | None = None) -> torch.Tensor:
    """``[T, W]`` float32: each row of ``x`` ``[T, K]`` times ``a[slot].T`` (``a`` ``[slots, W, K]``), zeros
    for slot -1. ``used``: the ranks that can be nonzero (the rest of ``a``'s rows are padding, never read)."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, contiguous=False)
    check_tensor("a", a, ndim=3, dtypes=(x.dtype,), device=x.device)
    _check_slots(slots, x.shape[0], x.device)
    if x.stride(1) != 1 or a.shape[2] != x.shape[1]:
        raise ValueError(f"x: expected unit column stride and {a.shape[2]} columns, got {tuple(x.shape)}")
    rank = a.shape[1]
    _check_rank("a", rank)
    used = rank if used is None else used
    if not 0 < used <= rank:
        raise ValueError(f"used: expected 1..{rank} ranks, got {used}")
    out = torch.zeros(x.shape[0], rank, dtype=torch.float32, device=x.device)
    if x.shape[0]:
        block_k = min(_BLOCK_K, max(16, triton.next_power_of_2(x.shape[1])))
        span = shrink_span(x.shape[0], x.shape[1], block_k)
        grid = (a.shape[0], triton.cdiv(x.shape[0], _BLOCK_T), triton.cdiv(x.shape[1], span))
        _shrink_kernel[grid](
            x, a, slots, out, x.shape[0], x.stride(0), span,
            K=x.shape[1], R=rank, USED=used, BLOCK_T=_BLOCK_T, BLOCK_K=block_k, DOT_FP32=_dot_fp32(x.dtype),
        )  # fmt: skip
    return out


def shrink_span(rows: int, k: int, block_k: int = _BLOCK_K) -> int:
    """The columns of K each shrink program reduces (a multiple of ``block_k``): a decode step's few row
    blocks get K split towards _PROGRAMS programs; a long prefill's row blocks fill the GPU alone and keep K
    whole, since every split adds a partial sum's atomics."""
    splits = max(1, min(triton.cdiv(_PROGRAMS, triton.cdiv(rows, _BLOCK_T)), triton.cdiv(k, _MIN_SPAN)))
    return triton.cdiv(triton.cdiv(k, splits), block_k) * block_k


def lora_expand(
    h: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, y: torch.Tensor, starts: tuple[int, ...] = (0,)
) -> None:
    """Add each row's adapter delta into ``y`` ``[T, N]`` in place; rows of slot -1 are left as they are.

    ``b`` ``[slots, N, R]`` holds the B of up to three projections merged into one (``starts``: the output
    column where each begins); projection s reads the ranks ``[s * R, (s + 1) * R)`` of ``h`` (float32
    ``[T, W]``, the shrink's output), so the delta of column n is ``h[t, s*R:(s+1)*R] @ b[slot, n]``."""
    check_tensor("h", h, ndim=2, dtypes=(torch.float32,))
    check_tensor("b", b, ndim=3, dtypes=FLOAT_DTYPES, device=h.device)
    check_tensor("y", y, ndim=2, dtypes=(b.dtype,), device=h.device, contiguous=False)
    _check_slots(slots, h.shape[0], h.device)
    rank, n = b.shape[2], b.shape[1]
    if h.shape[1] < len(starts) * rank or y.shape != (h.shape[0], n) or y.stride(1) != 1:
        raise ValueError(
            f"expected h [T, >= {len(starts)} * R], b [slots, N, R] and y [T, N] with unit column stride; got "
            f"h {tuple(h.shape)}, b {tuple(b.shape)}, y {tuple(y.shape)} (strides {y.stride()})"
        )
    _check_rank("b", rank)
    if b.numel() >= 2**31:
        raise ValueError(f"b: expected fewer than 2**31 elements (32-bit offsets), got shape {tuple(b.shape)}")
    block_n = _slice_block(starts, n)
    bounds = (*starts[1:], n, n)
    if h.shape[0]:
        grid = (triton.cdiv(h.shape[0], _BLOCK_T), triton.cdiv(n, block_n))
        _expand_kernel[grid](
            h, b, slots, y, h.shape[0], y.stride(0), b.shape[0],
            N=n, R=rank, W=h.shape[1], N1=bounds[0], N2=bounds[1],
            BLOCK_T=_BLOCK_T, BLOCK_N=block_n, DOT_FP32=_dot_fp32(b.dtype),
        )  # fmt: skip


def _slice_block(starts: tuple[int, ...], n: int) -> int:
    """The widest output tile (16 to 64 columns) that no projection boundary cuts."""
    if not 1 <= len(starts) <= 3 or starts[0] != 0 or list(starts) != sorted(set(starts)) or starts[-1] >= n:
        raise ValueError(f"starts: expected 1 to 3 increasing column offsets from 0 below {n}, got {starts}")
    block = _BLOCK_N
    while block >= 16 and any(start % block for start in starts):
        block //= 2
    if block < 16:
        raise ValueError(f"starts: expected projection boundaries at multiples of 16 columns, got {starts}")
    return block
