"""Batched LoRA in Triton: every token row with its own adapter, in one launch per product.

``lora_shrink`` computes ``x @ A.T`` into a float32 ``[T, R]`` buffer and ``lora_expand`` adds ``h @ B.T``
into the base projection's output. The adapters sit stacked in preallocated tensors (``a``
``[slots, R, K]``, ``b`` ``[slots, N, R]``, R a power of two >= 16 with each adapter's own rank zero-padded)
and each row's slot comes as an int32 device tensor (-1: no adapter), so a CUDA graph captures the
launches once and replays them whatever adapters the slots hold later.

A shrink program ``(slot, row block)`` handles the rows of its block that use its slot and returns at
once where none does: an adapter's A is read once per row block, not once per row. An expand program
``(row block, column tile)`` adds the deltas of every adapter its rows use into its output tile, which it
reads and writes once; a block of rows without adapters returns at once. ``kernels.lora_reference`` is the
torch twin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_tensor, interpreting

_BLOCK_T = 16
_BLOCK_K = 64
_BLOCK_N = 64


# T (the step's rows) unspecialized: a new batch size compiles nothing.
@triton.jit(do_not_specialize=["T"])
def _shrink_kernel(
    x_ptr, a_ptr, slots_ptr, out_ptr, T, stride_x,
    K: tl.constexpr, R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
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
    acc = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        in_k = ks < K
        x = tl.load(x_rows + ks[None, :], mask=mine[:, None] & in_k[None, :], other=0.0)
        a = tl.load(a_base + ranks[:, None] * K + ks[None, :], mask=in_k[None, :], other=0.0)
        if DOT_FP32:
            acc += tl.dot(x.to(tl.float32), tl.trans(a.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(a))
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * R + ranks[None, :], acc, mask=mine[:, None])


@triton.jit(do_not_specialize=["T"])
def _expand_kernel(
    h_ptr, b_ptr, slots_ptr, y_ptr, T, stride_y, SLOTS,
    N: tl.constexpr, R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_slots = tl.load(slots_ptr + rows, mask=rows < T, other=-1)
    if tl.max(row_slots, axis=0) < 0:
        return  # no row of this block has an adapter
    ranks = tl.arange(0, R)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = cols < N
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * R + ranks[None, :]
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


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[T, R]`` float32: each row of ``x`` ``[T, K]`` times ``a[slot].T`` (``a`` ``[slots, R, K]``), zeros
    for slot -1."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, contiguous=False)
    check_tensor("a", a, ndim=3, dtypes=(x.dtype,), device=x.device)
    _check_slots(slots, x.shape[0], x.device)
    if x.stride(1) != 1 or a.shape[2] != x.shape[1]:
        raise ValueError(f"x: expected unit column stride and {a.shape[2]} columns, got {tuple(x.shape)}")
    rank = a.shape[1]
    _check_rank("a", rank)
    out = torch.zeros(x.shape[0], rank, dtype=torch.float32, device=x.device)
    if x.shape[0]:
        grid = (a.shape[0], triton.cdiv(x.shape[0], _BLOCK_T))
        block_k = min(_BLOCK_K, max(16, triton.next_power_of_2(x.shape[1])))
        _shrink_kernel[grid](
            x, a, slots, out, x.shape[0], x.stride(0),
            K=x.shape[1], R=rank, BLOCK_T=_BLOCK_T, BLOCK_K=block_k, DOT_FP32=_dot_fp32(x.dtype),
        )  # fmt: skip
    return out


def lora_expand(h: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, y: torch.Tensor) -> None:
    """Add each row's ``h[t] @ b[slot].T`` (``h`` float32 ``[T, R]``, ``b`` ``[slots, N, R]``) into ``y``
    ``[T, N]`` in place; rows of slot -1 are left as they are."""
    check_tensor("h", h, ndim=2, dtypes=(torch.float32,))
    check_tensor("b", b, ndim=3, dtypes=FLOAT_DTYPES, device=h.device)
    check_tensor("y", y, ndim=2, dtypes=(b.dtype,), device=h.device, contiguous=False)
    _check_slots(slots, h.shape[0], h.device)
    if b.shape[2] != h.shape[1] or y.shape != (h.shape[0], b.shape[1]) or y.stride(1) != 1:
        raise ValueError(
            f"expected h [T, R], b [slots, N, R] and y [T, N] with unit column stride; got h {tuple(h.shape)}, "
            f"b {tuple(b.shape)}, y {tuple(y.shape)} (strides {y.stride()})"
        )
    _check_rank("b", b.shape[2])
    if b.numel() >= 2**31:
        raise ValueError(f"b: expected fewer than 2**31 elements (32-bit offsets), got shape {tuple(b.shape)}")
    if h.shape[0]:
        grid = (triton.cdiv(h.shape[0], _BLOCK_T), triton.cdiv(b.shape[1], _BLOCK_N))
        _expand_kernel[grid](
            h, b, slots, y, h.shape[0], y.stride(0), b.shape[0],
            N=b.shape[1], R=b.shape[2], BLOCK_T=_BLOCK_T, BLOCK_N=_BLOCK_N, DOT_FP32=_dot_fp32(b.dtype),
        )  # fmt: skip
