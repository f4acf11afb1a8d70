"""The batch-1 decode of a model with LoRA slots: the fused one-row kernels of the base model
(``engine.models.llama_rows.decode_row``), with each projection's adapter delta added to its output.

The one-row kernels fold the norms into the projections that read them, so the adapters' shrink reads a
norm computed apart; the o and down projections add the residual as they write, and the delta adds to that
sum as it would to the projection alone; the gate/up projection writes its two halves, the delta is added,
and the activation runs after."""

from __future__ import annotations

from typing import Any

import torch


def decode_row_with_lora(
    model: Any,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    meta: Any,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    rotary_table: torch.Tensor,
) -> torch.Tensor:
    """``hidden`` ``[1, hidden]`` through every layer of ``model`` (engine.models.llama.LlamaModel), whose
    ``lora`` (engine.lora.slots.LoraSlots) holds the step's adapter."""
    eps, ops, lora = model.shape.rms_norm_eps, model.ops, model.lora
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(model.layers, kv_caches)):
        qkv = layer.qkv.fused(hidden, norm_weight=layer.input_norm, eps=eps)
        lora.apply(i, "qkv", ops.rms_norm(hidden, layer.input_norm, eps), qkv)
        attn = model._attention(layer, qkv, positions, meta, k_cache, v_cache, rotary_table)
        out = layer.o.fused(attn, residual=hidden)
        lora.apply(i, "o", attn, out)
        hidden = out
        gate_up = layer.gate_up.fused(hidden, norm_weight=layer.post_norm, eps=eps)
        lora.apply(i, "gate_up", ops.rms_norm(hidden, layer.post_norm, eps), gate_up)
        act = ops.silu_and_mul(gate_up)
        out = layer.down.fused(act, residual=hidden)
        lora.apply(i, "down", act, out)
        hidden = out
    return hidden
