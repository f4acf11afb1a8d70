"""A Llama-family decoder layer's weights, and the per-layer path over them: every norm, projection and residual
add a call of its own, with the layer boundaries at hand for DeepStack rows, captured layer outputs and the
LoRA deltas of a batch of any size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from omni_gateway.engine.models.linear import Linear
from omni_gateway.engine.models.moe import MoeBlock
from omni_gateway.engine.quant.cpu_linear import QuantizedLinear
from omni_gateway.engine.runner.attention import AttentionMetadata

if TYPE_CHECKING:
    from omni_gateway.engine.models.llama import LlamaModel


@dataclass(slots=True)
class LlamaLayer:
    input_norm: torch.Tensor
    qkv: Linear | QuantizedLinear
    o: Linear | QuantizedLinear
    post_norm: torch.Tensor
    gate_up: Linear | QuantizedLinear | None  # merged on CUDA; None on the CPU, which uses gate/up
    gate: Linear | QuantizedLinear | None
    up: Linear | QuantizedLinear | None
    down: Linear | QuantizedLinear | None  # None in a mixture-of-experts layer
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    moe: MoeBlock | None = None  # the experts that replace the dense MLP in a sparse layer


def decode_per_layer(
    model: LlamaModel,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    meta: AttentionMetadata,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    rotary_table: torch.Tensor,
    deepstack: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``LlamaModel.decode_layers`` one layer at a time; keeps the outputs of ``model.aux_layers`` in
    ``model.aux_hidden``."""
    aux = model.aux_layers
    ops, eps, all_reduce = model.ops, model.shape.rms_norm_eps, model.parallel.all_reduce
    kept = hidden.new_empty((hidden.shape[0], len(aux), hidden.shape[1])) if aux else None
    residual: torch.Tensor | None = None
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(model.layers, kv_caches)):
        if residual is None:
            residual = hidden
            x = ops.rms_norm(hidden, layer.input_norm, eps)
        else:
            x, residual = ops.fused_add_rms_norm(hidden, residual, layer.input_norm, eps)
        attn = model._attention(
            layer, project(model, i, "qkv", layer.qkv, x), positions, meta, k_cache, v_cache, rotary_table
        )
        o = project(model, i, "o", layer.o, attn)
        x, residual = ops.fused_add_rms_norm(all_reduce(o), residual, layer.post_norm, eps)
        if layer.moe is not None:
            hidden = all_reduce(layer.moe(x))
        else:
            hidden = all_reduce(dense_mlp(model, i, layer, x))
        if deepstack is not None and i < deepstack[1].shape[0]:
            # The layer's output is hidden + residual; the rows join it there.
            hidden = hidden.index_add(0, deepstack[0], deepstack[1][i].to(hidden.dtype))
        if kept is not None and i in aux:
            for slot, layer_index in enumerate(aux):
                if layer_index == i:
                    kept[:, slot] = hidden + residual
    assert residual is not None
    model.aux_hidden = kept
    return hidden + residual


def dense_mlp(model: LlamaModel, index: int, layer: LlamaLayer, x: torch.Tensor) -> torch.Tensor:
    if layer.gate_up is not None:
        act = model.ops.silu_and_mul(project(model, index, "gate_up", layer.gate_up, x))
    else:
        assert layer.gate is not None and layer.up is not None
        act = F.silu(project(model, index, "gate", layer.gate, x)) * project(model, index, "up", layer.up, x)
    assert layer.down is not None
    return project(model, index, "down", layer.down, act)


def project(model: LlamaModel, index: int, group: str, linear: Any, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)``, plus the LoRA deltas of the rows that have an adapter (engine.lora.slots.attach_lora)."""
    y = linear(x)
    lora = model.lora
    if lora is not None and lora.active:
        lora.apply(index, group, x, y)
    return y
