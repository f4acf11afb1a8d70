"""The tensors a Hugging Face checkpoint of a Llama-family decoder (dense or mixture of experts) holds for the engine,
under the names the loader gives them (engine/runner/loader.py) and with their stored shapes, read from the config
alone: what ``--load-format dummy`` fills without a checkpoint."""

from __future__ import annotations

from typing import Any

from omni_gateway.engine.models.llama_shape import ModelShape
from omni_gateway.engine.models.moe_config import MoeConfig


def checkpoint_shapes(hf_config: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight ``LlamaModel`` reads from a checkpoint of ``hf_config`` (a text config: the
    language model's own for a multimodal checkpoint)."""
    s = ModelShape.from_hf(hf_config)
    hidden, q_rows, kv_rows = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (s.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not s.tie_embeddings:
        shapes["lm_head.weight"] = (s.vocab_size, hidden)
    # Llama's ``attention_bias`` puts a bias on o_proj too; the Qwen2 family biases q/k/v only.
    o_bias = bool(getattr(hf_config, "attention_bias", False))
    moe = MoeConfig.of(hf_config)
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        for name, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (rows, hidden)
            if s.qkv_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, q_rows)
        if o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if s.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = shapes[p + "self_attn.k_norm.weight"] = (s.head_dim,)
        if moe is not None and moe.is_sparse(i):
            shapes.update(_moe_shapes(p + "mlp.", moe, hidden))
        else:
            shapes.update(_mlp_shapes(p + "mlp.", int(hf_config.intermediate_size), hidden))
    return shapes


def _mlp_shapes(prefix: str, intermediate: int, hidden: int) -> dict[str, tuple[int, ...]]:
    return {
        prefix + "gate_proj.weight": (intermediate, hidden),
        prefix + "up_proj.weight": (intermediate, hidden),
        prefix + "down_proj.weight": (hidden, intermediate),
    }


def _moe_shapes(prefix: str, moe: MoeConfig, hidden: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {prefix + "gate.weight": (moe.num_experts, hidden)}
    for j in range(moe.num_experts):
        shapes.update(_mlp_shapes(f"{prefix}experts.{j}.", moe.expert_intermediate_size, hidden))
    if moe.shared_expert_intermediate_size:
        shapes.update(_mlp_shapes(prefix + "shared_expert.", moe.shared_expert_intermediate_size, hidden))
        shapes[prefix + "shared_expert_gate.weight"] = (1, hidden)
    return shapes
