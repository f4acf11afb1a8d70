"""Mixture-of-experts in plain torch: the router's top-k, the per-expert token layout the grouped GEMMs of
kernels/fused_moe.py read, and the per-expert loop that is their twin (and the engine's CPU path).

Expert weights are stacked: ``w13`` ``[E, 2I, H]`` holds each expert's gate rows then its up rows, ``w2``
``[E, H, I]`` its down projection. FP8 weights (float8_e4m3fn) carry a float32 scale per expert and output
channel (``w13_scale`` ``[E, 2I]``, ``w2_scale`` ``[E, H]``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPE = torch.float8_e4m3fn


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` experts of each token and their weights: softmax over all experts in float32, then
    the top ``top_k`` (renormalized to sum to one where the model does: Mixtral, Qwen3-MoE's
    ``norm_topk_prob``). Returns float32 weights and int64 ids, both ``[T, top_k]``."""
    if logits.dim() != 2 or not 0 < top_k <= logits.shape[1]:
        raise ValueError(f"route: expected logits [T, E] with 0 < top_k <= E, got {tuple(logits.shape)}, {top_k}")
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def local_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
    """Expert ids in this rank's numbering: ``expert_map[global id]`` (-1 where another rank holds the expert)."""
    return topk_ids if expert_map is None else expert_map[topk_ids]


def padded_capacity(num_items: int, num_experts: int, block_m: int) -> int:
    """Slots of the sorted layout: every item, plus at most ``block_m - 1`` padding per expert that has
    items (no more than ``num_items`` of them), rounded up to whole blocks. Fixed by the step's token
    count alone, so a CUDA graph can hold it."""
    slots = num_items + min(num_items, num_experts) * (block_m - 1)
    return -(-slots // block_m) * block_m


def align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flat (token * top_k + slot) ids grouped by expert, each expert's group padded to a whole number of
    ``block_m`` rows; ids of -1 (another rank's experts) are left out. Returns

    - ``sorted_ids`` int32 ``[padded_capacity]``: flat ids, padding and unused slots hold ``T * top_k``;
    - ``expert_ids`` int32 ``[padded_capacity / block_m]``: the expert of each block;
    - ``num_padded`` int32 ``[1]``: slots in use (blocks past it are skipped).

    Device ops only, of sizes fixed by the token count: no host sync, so CUDA graphs can capture it."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    n, device = flat.numel(), flat.device
    capacity = padded_capacity(n, num_experts, block_m)
    bucket = torch.where(flat < 0, num_experts, flat)  # one bucket past the experts for the ids left out
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(flat))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(bucket, stable=True)
    sorted_bucket = bucket[order]
    rank = torch.arange(n, device=device) - (torch.cumsum(counts, 0) - counts)[sorted_bucket]
    starts = torch.cat((ends - padded, ends.new_full((1,), capacity)))  # the left-out bucket lands past the end
    dest = torch.where(sorted_bucket < num_experts, starts[sorted_bucket] + rank, capacity)
    sorted_ids = torch.full((capacity + 1,), n, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, capacity, block_m, device=device)
    expert_ids = torch.searchsorted(ends, block_starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids[:capacity], expert_ids, ends[-1:].to(torch.int32)


def dequantize_experts(weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Stacked expert weights in ``dtype``: FP8 codes times their per-channel scale, float ones as they are."""
    if scale is None:
        return weight.to(dtype)
    return (weight.to(torch.float32) * scale.unsqueeze(-1)).to(dtype)


def quantize_experts(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked expert weights ``[E, N, K]`` in FP8 with a float32 scale per expert and output channel."""
    amax = weight.float().abs().amax(dim=-1).clamp_min(1e-12)
    scale = amax / torch.finfo(FP8_DTYPE).max
    codes = (weight.float() / scale.unsqueeze(-1)).clamp(torch.finfo(FP8_DTYPE).min, torch.finfo(FP8_DTYPE).max)
    return codes.to(FP8_DTYPE), scale


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    expert_map: torch.Tensor | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_k weight[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t))`` over each token's experts ``e = ids[t, k]``,
    one expert at a time (the twin of kernels/fused_moe.py's ``fused_moe``). ``expert_map`` maps global
    expert ids to the rows of ``w13``/``w2`` this rank holds (-1: held elsewhere, contributes nothing).
    Returns ``[T, H]`` in ``x``'s dtype."""
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    flat = local_ids(topk_ids, expert_map).reshape(-1)
    weights = topk_weights.reshape(-1)
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32 if x.dtype != torch.float32 else x.dtype, device=x.device)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat.clamp_min(-1) + 1, minlength=num_experts + 1).tolist()  # [left out, e0, e1, ...]
    start = counts[0]
    for expert, count in enumerate(counts[1:]):
        if count == 0:
            continue
        items = order[start : start + count]
        start += count
        tokens = items // top_k
        gate_up = F.linear(
            x[tokens], dequantize_experts(w13[expert], None if w13_scale is None else w13_scale[expert], x.dtype)
        )
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        down = F.linear(act, dequantize_experts(w2[expert], None if w2_scale is None else w2_scale[expert], x.dtype))
        out.index_add_(0, tokens, (down.float() * weights[items, None].float()).to(out.dtype))
    return out.to(x.dtype)
