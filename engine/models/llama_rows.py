"""The batch-1 decode of a Llama-family model through the fused one-row kernels (``Linear.fused``): each norm runs
inside the linear that reads it and the o and down projections add the residual as they write. Where every layer
linear streams (kernels/int4_row_stream.py) the residual stream is a float32 row that the projections add into."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from omni_gateway.engine.lora.rows import decode_row_with_lora
from omni_gateway.engine.models.linear import Linear
from omni_gateway.engine.runner.attention import AttentionMetadata, paged_attention

if TYPE_CHECKING:
    from omni_gateway.engine.models.llama import LlamaModel


def fuses_rows(model: LlamaModel) -> bool:
    """Whether every layer linear has a one-row kernel (``LlamaModel.row_fusion``)."""
    if model.parallel.is_parallel or model.fused_cpu_layers:
        return False  # sharded outputs are summed before the residual add; the CPU path fuses its own
    return all(isinstance(lin, Linear) and lin.row is not None for lin in _layer_linears(model))


def streams_rows(model: LlamaModel) -> bool:
    """Whether every layer linear adds into a float32 stream row (``LlamaModel.row_stream``)."""
    if model.dtype != torch.bfloat16 or not all(lin.row_streams for lin in _layer_linears(model)):
        return False
    return all(lin.bias is None for layer in model.layers for lin in (layer.o, layer.gate_up, layer.down))


def _layer_linears(model: LlamaModel) -> list[Any]:
    return [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]


def decode_row(
    model: LlamaModel,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    meta: AttentionMetadata,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    rotary_table: torch.Tensor,
) -> torch.Tensor:
    """``LlamaModel.decode_layers`` for one token: ``hidden`` is the residual stream throughout. Each norm runs
    inside the linear that reads it, the o and down projections add the residual as they write, and
    the gate/up projection writes the MLP's activation: four linears and the attention per layer."""
    if model.row_stream:
        return decode_stream(model, hidden, positions, meta, kv_caches, rotary_table)
    if model.lora is not None and model.lora.active:
        return decode_row_with_lora(model, hidden, positions, meta, kv_caches, rotary_table)
    eps = model.shape.rms_norm_eps
    for layer, (k_cache, v_cache) in zip(model.layers, kv_caches):
        assert isinstance(layer.qkv, Linear) and isinstance(layer.o, Linear)
        assert isinstance(layer.gate_up, Linear) and isinstance(layer.down, Linear)
        qkv = layer.qkv.fused(hidden, norm_weight=layer.input_norm, eps=eps)
        attn = model._attention(layer, qkv, positions, meta, k_cache, v_cache, rotary_table)
        hidden = layer.o.fused(attn, residual=hidden)
        act = layer.gate_up.fused(hidden, norm_weight=layer.post_norm, eps=eps, gated=True)
        hidden = layer.down.fused(act, residual=hidden)
    return hidden


def decode_stream(
    model: LlamaModel,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    meta: AttentionMetadata,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    rotary_table: torch.Tensor,
) -> torch.Tensor:
    """``decode_row`` with the residual stream a float32 row (``row_stream``, kernels/int4_row_stream.py):
    the o and down projections add into it, the gate/up projection into its layer's zeroed GateSums."""
    from omni_gateway.kernels.int4_row_stream import GateSums, StreamRow

    eps = model.shape.rms_norm_eps
    stream = StreamRow(hidden.float())
    assert isinstance(model.layers[0].down, Linear)
    sums = GateSums.zeros(len(model.layers), model.layers[0].down.weight.shape[1], hidden.shape[1], eps, hidden.device)
    for layer, gate_sums, (k_cache, v_cache) in zip(model.layers, sums, kv_caches):
        assert isinstance(layer.qkv, Linear) and isinstance(layer.o, Linear)
        assert isinstance(layer.gate_up, Linear) and isinstance(layer.down, Linear)
        if model.rotary_fold:
            rotary = _rotary_write(model, positions, rotary_table, k_cache, v_cache, meta.slot_mapping)
            q = layer.qkv.fused(stream, norm_weight=layer.input_norm, eps=eps, rotary=rotary)[:, : model.q_size]
            q = q.view(1, model.num_heads, model.shape.head_dim)
            attn = paged_attention(model.ops, q, k_cache, v_cache, meta, model.scale).view(1, model.q_size)
        else:
            qkv = layer.qkv.fused(stream, norm_weight=layer.input_norm, eps=eps)
            attn = model._attention(layer, qkv, positions, meta, k_cache, v_cache, rotary_table)
        layer.o.fused(attn, into=stream)
        layer.gate_up.fused(stream, norm_weight=layer.post_norm, eps=eps, gated=True, into=gate_sums)
        layer.down.fused(gate_sums, into=stream)
    hidden = stream.row.to(hidden.dtype)
    model.last_stream = (hidden, stream) if model.head_stream else None
    return hidden


def _rotary_write(model: LlamaModel, *operands: torch.Tensor) -> Any:
    """What the qkv projection's epilogue needs to rotate q and k and cache k and v
    (kernels/int4_row_epilogue.py ``RotaryWrite``, imported here: only CUDA int4 models reach it)."""
    from omni_gateway.kernels.int4_row_epilogue import RotaryWrite

    return RotaryWrite(*operands, num_q_heads=model.num_heads, num_kv_heads=model.num_kv_heads)
