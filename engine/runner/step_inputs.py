"""The device tensors of a step plan (engine/runner/step_plan.py), uploaded without waiting for the device."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from omni_gateway.engine.runner.attention import AttentionMetadata, KernelOps, plan_step
from omni_gateway.engine.runner.step_plan import StepPlan
from omni_gateway.kernels.host_copies import to_device


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor
    embed_rows: torch.Tensor | None
    embeds: torch.Tensor | None
    deepstack: tuple[torch.Tensor, torch.Tensor] | None = None  # (flat rows, [layers, rows, hidden])


def upload_step(
    plan: StepPlan,
    device_ids: torch.Tensor | None,
    *,
    ops: KernelOps,
    device: torch.device,
    block_size: int,
    split_counters: torch.Tensor | None,
) -> StepInputs:
    """The device tensors of a plan. Every upload is asynchronous (pinned memory): a step launched
    while another is in flight must not wait for the device."""
    meta = AttentionMetadata(
        slot_mapping=to_device(plan.slots, torch.int64, device),
        num_decode=plan.num_decode,
        decode_seq_lens=to_device(plan.decode_lens, torch.int32, device),
        decode_block_tables=_block_tables(plan.decode_tables, device),
        prefill_cu_seqlens_q=to_device(plan.cu_q, torch.int32, device),
        prefill_seq_lens=to_device(plan.prefill_lens, torch.int32, device),
        prefill_block_tables=_block_tables(plan.prefill_tables, device),
        num_tokens=plan.num_tokens,
        split_counters=split_counters,
    )
    plan_step(ops, meta, block_size)
    return StepInputs(
        input_ids=device_ids if device_ids is not None else to_device(plan.ids, torch.int64, device),
        positions=to_device(plan.positions, torch.int64, device),  # M-RoPE's [3, T] tensor or a list
        meta=meta,
        sample_rows=to_device(plan.sample_rows, torch.int64, device),
        embed_rows=to_device(plan.embed_rows, torch.int64, device) if plan.embed_rows else None,
        embeds=plan.embeds.to(device) if plan.embeds is not None else None,
        deepstack=None
        if plan.deepstack is None
        else (to_device(plan.deepstack_rows, torch.int64, device), plan.deepstack.to(device)),
    )


def _block_tables(rows: np.ndarray, device: torch.device) -> torch.Tensor:
    """``rows`` on the device. Through pinned memory: a plain copy to CUDA would wait for the device,
    which a step launched while another is in flight must not do."""
    if rows.size == 0:
        return torch.zeros(rows.shape, dtype=torch.int32, device=device)
    table = torch.from_numpy(rows)
    return table.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else table
