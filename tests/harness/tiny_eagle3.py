"""Tiny EAGLE-3 checkpoints in the published key layout (``LlamaForCausalLMEagle3``: ``fc``, ``midlayer.*``,
``norm``, ``lm_head``, ``d2t``/``t2d``, no ``embed_tokens``), and a 4-layer tiny Llama target for them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tests.harness.checkpoints import VOCAB, byte_level_tokenizer, tiny_config

TARGET_LAYERS = 4
HIDDEN = 64


def save_tiny_target(directory: Path, seed: int = 0) -> Any:
    """A random 4-layer tiny Llama (vLLM's default EAGLE-3 layers (2, 2, 1) exist in it); returns the HF model."""
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama")
    config.num_hidden_layers = TARGET_LAYERS
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(directory)
    byte_level_tokenizer().save_pretrained(directory)
    return model


def eagle3_config(draft_vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    return dict(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB,
        draft_vocab_size=draft_vocab,
        max_position_embeddings=256,
        rope_theta=10000.0,
        **extra,
    )


def random_eagle3_weights(config: dict[str, Any], seed: int = 0, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """Random weights of ``config``'s shapes; a draft vocabulary smaller than the target's maps draft id ``d``
    to target id ``2 * d`` (every other token) through ``d2t``."""
    g = torch.Generator().manual_seed(seed)
    h, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hd = h // heads
    draft, vocab = config["draft_vocab_size"], config["vocab_size"]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(h, generator=g)

    weights = {
        "fc.weight": rand(h, 3 * config.get("target_hidden_size", h)),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": rand(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "norm.weight": norm(),
        "lm_head.weight": rand(draft, h),
    }
    targets = torch.arange(draft) * (2 if draft < vocab else 1)
    weights["d2t"] = targets - torch.arange(draft)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    weights["t2d"] = t2d
    return weights


def save_eagle3(directory: Path, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(directory / "model.safetensors"))
    return directory


def save_tiny_eagle3(directory: Path, seed: int = 0, draft_vocab: int = VOCAB, **extra: Any) -> Path:
    config = eagle3_config(draft_vocab, **extra)
    return save_eagle3(directory, config, random_eagle3_weights(config, seed))
