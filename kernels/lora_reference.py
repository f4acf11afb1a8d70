"""Batched LoRA in plain torch: the twin of ``kernels.lora`` (same signatures) and the CPU path.

Each token row carries the slot of its adapter in the stacked weights (-1: no adapter). ``a`` is
``[slots, W, K]`` and ``b`` ``[slots, N, R]``, R the padded rank: rows of ``a`` and columns of ``b`` past
an adapter's own rank are zero, so padding adds nothing. The loop runs once per adapter present in the
batch, over that adapter's rows only (all rows as a plain slice where one adapter has them all: a batch-1
step, or a batch on one adapter, gathers and scatters nothing).
"""

from __future__ import annotations

import torch

Rows = slice | torch.Tensor


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, used: int | None = None) -> torch.Tensor:
    """``[T, W]`` float32: each row of ``x`` ``[T, K]`` times its adapter's ``a[slot].T`` (zeros for slot -1).
    ``used``: the ranks that can be nonzero; the others come out zero."""
    out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    used = a.shape[1] if used is None else used
    for slot, rows in _groups(slots):
        out[rows, :used] = x[rows].float() @ a[slot, :used].float().T
    return out


def lora_expand(
    h: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, y: torch.Tensor, starts: tuple[int, ...] = (0,)
) -> None:
    """Add each row's delta into ``y`` ``[T, N]`` in place (rows of slot -1 untouched): output columns from
    ``starts[s]`` on (projection s of a merged one) take ``h[t, s*R:(s+1)*R] @ b[slot, n]``. ``h`` is rounded
    to ``b``'s dtype first, as the Triton kernel feeds its matrix unit."""
    rank = b.shape[2]
    bounds = (*starts, b.shape[1])
    for slot, rows in _groups(slots):
        part = h[rows].to(b.dtype).float()
        delta = torch.cat(
            [
                part[:, s * rank : (s + 1) * rank] @ b[slot, lo:hi].float().T
                for s, (lo, hi) in enumerate(zip(bounds, bounds[1:]))
            ],
            dim=1,
        )
        y[rows] = (y[rows].float() + delta).to(y.dtype)


def _groups(slots: torch.Tensor) -> list[tuple[int, Rows]]:
    """(slot, its rows) of every adapter present."""
    present = torch.unique(slots)
    if len(present) == 1:
        slot = int(present[0])
        return [] if slot < 0 else [(slot, slice(None))]
    return [(int(s), (slots == s).nonzero().squeeze(1)) for s in present.tolist() if s >= 0]
