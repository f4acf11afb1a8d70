"""Tiny random vision-language checkpoints (LLaVA, Qwen2-VL) saved with save_pretrained, with an
offline byte-level tokenizer that knows the media placeholder tokens and an image processor."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

VOCAB = 384
SPECIALS = ["<eos>", "<bos>", "<image>", "<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|vision_end|>"]
CORPUS = ["user: describe the picture in one short sentence please", "assistant: a red square on a blue field",
          "what changed between these two frames of the video", "the quick brown fox jumps over the lazy dog"] * 4


@functools.cache
def vlm_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>",
                                 extra_special_tokens={"image_token": "<image>"})
    hf.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}")
    assert len(hf) <= VOCAB
    return hf


def token_id(name: str) -> int:
    return vlm_tokenizer().convert_tokens_to_ids(name)


def _text_config(**extra: Any) -> dict[str, Any]:
    # A wide init keeps logits well apart, so greedy ties cannot flip on float rounding.
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.3, eos_token_id=0,
                bos_token_id=1, **extra)


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
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, image_size=56, patch_size=14, initializer_range=0.3),
        text_config=LlamaConfig(**_text_config()), image_token_id=token_id("<image>"),
        vision_feature_layer=-2, vision_feature_select_strategy="default", initializer_range=0.3)
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
        text_config=_text_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                  "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, initializer_range=0.3),
        image_token_id=token_id("<|image_pad|>"), video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"), vision_end_token_id=token_id("<|vision_end|>"),
        initializer_range=0.3)
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
    import io

    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
