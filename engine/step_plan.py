"""One step's flattened inputs as host values, decodes first and then prefill chunks: what the eager
forward uploads, what the prefill graphs stage and what every tensor-parallel rank builds its step from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class StepPlan:
    """``ids`` is empty when the step was launched ahead: its token ids are then on the device (the
    tokens the step in flight samples), ``num_tokens`` of them.
    """

    ids: list[int]
    num_tokens: int
    positions: list[int] | torch.Tensor  # [3, T] for M-RoPE
    slots: list[int]
    num_decode: int
    decode_lens: list[int]
    decode_tables: np.ndarray  # int32 [num_decode, blocks]: arrays pickle as one copy of their bytes
    cu_q: list[int]
    prefill_lens: list[int]
    prefill_tables: np.ndarray
    sample_rows: list[int]  # flat token index of each sampling sequence's last token
    embed_rows: list[int]
    embeds: torch.Tensor | None
