"""Triton greedy token choice: the index of each logits row's largest value, first one on ties.

``torch.argmax`` reduces a single row of a 128k-152k vocabulary in one thread block on the GPU
(about 30 us on an H200 for one row of 128k float32). Batch-1 decode needs exactly that, every
token, so here each row is split into up to ``_MAX_CHUNKS`` chunks reduced in parallel, and a
second launch reduces each row's chunk winners.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_tensor

_MIN_CHUNK = 1024
_MAX_CHUNKS = 256


@triton.jit
def _chunk_max_kernel(logits_ptr, max_ptr, idx_ptr, VOCAB: tl.constexpr, CHUNKS: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * VOCAB + cols, mask=cols < VOCAB, other=float("-inf")).to(tl.float32)
    # Padding is -inf and lies after every real column, so the leftmost maximum is always real.
    best, at = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(max_ptr + row * CHUNKS + chunk, best)
    tl.store(idx_ptr + row * CHUNKS + chunk, chunk * CHUNK + at)


@triton.jit
def _row_max_kernel(max_ptr, idx_ptr, out_ptr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, CHUNKS_P2)
    ok = offs < CHUNKS
    best = tl.load(max_ptr + row * CHUNKS + offs, mask=ok, other=float("-inf"))
    # Chunks are in column order, so the leftmost chunk holding the maximum holds its first column.
    winner = tl.argmax(best, axis=0, tie_break_left=True)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * CHUNKS + winner))


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """int64 ``[rows]``: the column of each row's largest value, the lowest column on ties.

    ``logits`` is ``[rows, vocab]``, contiguous, float32/bfloat16/float16. Rows must be free of NaN
    (``torch.argmax`` would pick a NaN; this picks the largest number).
    """
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    rows, vocab = logits.shape
    if vocab == 0:
        raise ValueError(f"logits: expected at least one column, got shape {tuple(logits.shape)}")
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    chunk = max(_MIN_CHUNK, triton.next_power_of_2(triton.cdiv(vocab, _MAX_CHUNKS)))
    chunks = triton.cdiv(vocab, chunk)
    maxes = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    indices = torch.empty(rows, chunks, dtype=torch.int64, device=logits.device)
    _chunk_max_kernel[(rows, chunks)](logits, maxes, indices, VOCAB=vocab, CHUNKS=chunks, CHUNK=chunk)
    _row_max_kernel[(rows,)](maxes, indices, out, CHUNKS=chunks, CHUNKS_P2=triton.next_power_of_2(chunks))
    return out
