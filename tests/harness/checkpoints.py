"""Tiny random checkpoints (saved with ``save_pretrained``) and the small trained tokenizers they carry,
built offline in seconds: the tests' models and the benchmarks' CPU-sized ones.

Text models (Llama, Llama-3 RoPE, Mistral, Qwen2, Qwen3, and the mixtures of experts Qwen2-MoE, Qwen3-MoE and
Mixtral) come with a byte-level BPE tokenizer;
vision-language models (LLaVA, Qwen2-VL) with a tokenizer that knows the media placeholder tokens and
an image processor.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

VOCAB = 384  # >= either tokenizer's size (330 and 320 tokens)
CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "Grüße aus München! naïve café",
    "The end of the story is near. User: hi. Assistant: hello there.",
    "def f(x): return x * 2  # numbers 0123456789",
] * 10
VLM_SPECIALS = ["<eos>", "<bos>", "<image>", "<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|vision_end|>"]
VLM_CORPUS = [
    "user: describe the picture in one short sentence please",
    "assistant: a red square on a blue field",
    "what changed between these two frames of the video",
    "the quick brown fox jumps over the lazy dog",
] * 4
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _trained_byte_level(corpus: list[str], vocab_size: int, specials: list[str], **extra: Any) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>", **extra)
    hf.chat_template = _CHAT_TEMPLATE
    if len(hf) > VOCAB:
        raise ValueError(f"a tiny tokenizer must fit the tiny models' {VOCAB}-token vocabulary, got {len(hf)} tokens")
    return hf


@functools.cache
def byte_level_tokenizer() -> Any:
    """GPT-2 style byte-level BPE; text outside the corpus falls apart into single bytes."""
    return _trained_byte_level(CORPUS, 330, ["<eos>", "<bos>"])


@functools.cache
def vlm_tokenizer() -> Any:
    """Byte-level BPE with the LLaVA and Qwen2-VL media placeholder tokens."""
    return _trained_byte_level(VLM_CORPUS, 320, VLM_SPECIALS, extra_special_tokens={"image_token": "<image>"})


def token_id(name: str) -> int:
    """The id of a token of :func:`vlm_tokenizer`."""
    return vlm_tokenizer().convert_tokens_to_ids(name)


def _text_config(max_position_embeddings: int, **extra: Any) -> dict[str, Any]:
    # A wide init keeps logits well apart, so greedy ties cannot flip on float rounding.
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.3,
        eos_token_id=0,
        bos_token_id=1,
        **extra,
    )


TEXT_KINDS = ("llama", "llama3-rope", "mistral", "qwen2", "qwen3")
# 8 experts, top-2, each of intermediate size 32. Qwen3-MoE's first layer is dense (``mlp_only_layers``) and its
# top-k weights renormalized; Qwen2-MoE's are not, and it adds a gated shared expert; Mixtral always renormalizes.
MOE_KINDS = ("qwen3-moe", "qwen2-moe", "mixtral")
_MOE = dict(num_experts_per_tok=2)


def tiny_config(kind: str) -> Any:
    """The HF config of a 2-layer random text model of ``kind`` (one of ``TEXT_KINDS`` or ``MOE_KINDS``)."""
    from transformers import (
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Qwen2Config,
        Qwen2MoeConfig,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    common = _text_config(256)
    if kind == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    if kind == "llama3-rope":
        return LlamaConfig(
            **common,
            tie_word_embeddings=True,
            rope_theta=50000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if kind == "mistral":
        return MistralConfig(**common, sliding_window=64, tie_word_embeddings=False)
    if kind == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=True)
    if kind == "qwen3":
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
    moe = dict(num_experts=8, moe_intermediate_size=32, **_MOE)
    if kind == "qwen3-moe":
        return Qwen3MoeConfig(**common, **moe, head_dim=32, norm_topk_prob=True, mlp_only_layers=[0])
    if kind == "qwen2-moe":
        return Qwen2MoeConfig(**common, **moe, shared_expert_intermediate_size=48, norm_topk_prob=False)
    if kind == "mixtral":
        return MixtralConfig(**{**common, "intermediate_size": 32}, num_local_experts=8, **_MOE)
    raise ValueError(f"expected a tiny model kind among {', '.join(TEXT_KINDS + MOE_KINDS)}, got {kind!r}")


def save_tiny_checkpoint(kind: str, directory: Path, seed: int = 0) -> Any:
    """Save a random model of ``kind`` plus a tokenizer into ``directory``; returns the HF model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind), dtype=torch.float32).eval()
    model.save_pretrained(directory)
    byte_level_tokenizer().save_pretrained(directory)
    return model


def save_tiny_llava(directory: Path, seed: int = 0) -> Any:
    """LLaVA over a 2-layer Llama; CLIP tower 56x56 pixels in 14-pixel patches -> 16 tokens per image."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    torch.manual_seed(seed)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=56,
            patch_size=14,
            initializer_range=0.3,
        ),
        text_config=LlamaConfig(**_text_config(512)),
        image_token_id=token_id("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        initializer_range=0.3,
    )
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(directory)
    vlm_tokenizer().save_pretrained(directory)
    CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}).save_pretrained(directory)
    return model


def save_tiny_qwen2_vl(directory: Path, seed: int = 0) -> Any:
    """Qwen2-VL with a 2-layer LM (head_dim 16, mrope_section 2/3/3) and a 2-block ViT (patch 14, merge 2)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    torch.manual_seed(seed)
    config = Qwen2VLConfig(
        text_config=_text_config(
            512, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
        ),
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            initializer_range=0.3,
        ),
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        initializer_range=0.3,
    )
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.save_pretrained(directory)
    vlm_tokenizer().save_pretrained(directory)
    Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112).save_pretrained(directory)
    return model


def picture(seed: int, size: tuple[int, int] = (56, 56)) -> Image.Image:
    """A random RGB picture (distinct seeds give distinct pixels)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def png_bytes(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
