"""Batched LoRA in plain torch: the twin of ``kernels.lora`` (same signatures) and the CPU path.

Each token row carries the slot of its adapter in the stacked weights (-1: no adapter). ``a`` is
``[slots, R, K]`` and ``b`` ``[slots, N, R]``, R the padded rank: rows of ``a`` and columns of ``b`` past
an adapter's own rank are zero, so padding adds nothing. The loop runs once per adapter present in the
batch, over that adapter's rows only.
"""

from __future__ import annotations

import torch


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``[T, R]`` float32: each row of ``x`` ``[T, K]`` times its adapter's ``a[slot].T`` (zeros for slot -1)."""
    out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    for slot in _present(slots):
        rows = (slots == slot).nonzero().squeeze(1)
        out[rows] = x[rows].float() @ a[slot].float().T
    return out


def lora_expand(h: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, y: torch.Tensor) -> None:
    """Add each row's ``h[t] @ b[slot].T`` into ``y`` ``[T, N]`` in place (rows of slot -1 untouched).
    ``h`` is rounded to ``b``'s dtype first, as the Triton kernel feeds its matrix unit."""
    for slot in _present(slots):
        rows = (slots == slot).nonzero().squeeze(1)
        delta = h[rows].to(b.dtype).float() @ b[slot].float().T
        y[rows] = (y[rows].float() + delta).to(y.dtype)


def _present(slots: torch.Tensor) -> list[int]:
    return [int(s) for s in torch.unique(slots).tolist() if s >= 0]
