"""The shape of a Llama-family decoder read from its Hugging Face config, and the weight names it needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omni_gateway.engine.models.moe_config import mlp_weight_names

# Text model types of the Qwen2 family (plain, VL, 2.5-VL, 2.5-Omni thinker): q/k/v projections carry a bias.
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl_text", "qwen2_5_vl_text", "qwen2_5_omni_text"})
# Text model types of the Qwen3 family (plain, MoE, the Qwen3-Omni thinker): per-head RMSNorm on q and k.
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen3_omni_moe_text"})


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    tie_embeddings: bool

    @classmethod
    def from_hf(cls, cfg: Any) -> ModelShape:
        num_heads = int(cfg.num_attention_heads)
        model_type = getattr(cfg, "model_type", "llama")
        return cls(
            num_layers=int(cfg.num_hidden_layers),
            hidden_size=int(cfg.hidden_size),
            num_heads=num_heads,
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or num_heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads),
            vocab_size=int(cfg.vocab_size),
            rms_norm_eps=float(cfg.rms_norm_eps),
            qkv_bias=model_type in _QKV_BIAS_TYPES or bool(getattr(cfg, "attention_bias", False)),
            qk_norm=model_type in _QK_NORM_TYPES,
            tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )


def missing_weights(hf_config: Any, weights: dict[str, torch.Tensor]) -> list[str]:
    """Names the model needs that ``weights`` lacks (empty when complete)."""
    shape = ModelShape.from_hf(hf_config)
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    if not shape.tie_embeddings:
        need.append("lm_head.weight")
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        need += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        need += [f"{p}self_attn.{n}_proj.weight" for n in ("q", "k", "v", "o")]
        need += mlp_weight_names(hf_config, i)
        if shape.qkv_bias:
            need += [f"{p}self_attn.{n}_proj.bias" for n in ("q", "k", "v")]
        if shape.qk_norm:
            need += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
    return [n for n in need if n not in weights]
