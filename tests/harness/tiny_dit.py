"""Tiny random text-to-image pipelines saved to disk, so tests load them the way users load real ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

WORDS = ["<pad>", "</s>", "<unk>", "a", "cat", "dog", "red", "blue", "on", "the", "mat", "sky", "green", "tree"]

# PixArt-alpha's pipeline at test size: the shapes ``save_tiny_pixart`` saves and ``benchmarks.dit --preset tiny``
# times. A shape is the keyword arguments of the transformer, the VAE (beyond its RGB channels) and the T5 encoder.
TINY_PIXART: dict[str, dict[str, Any]] = {
    "transformer": dict(
        sample_size=8,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        in_channels=4,
        out_channels=8,
        caption_channels=32,
        cross_attention_dim=16,
        norm_type="ada_norm_single",
        patch_size=2,
        num_embeds_ada_norm=1000,
    ),
    "vae": dict(
        block_out_channels=(8, 16),
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=4,
        sample_size=32,
    ),
    "t5": dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4),
}


def word_tokenizer(words: list[str] = WORDS, max_length: int = 16) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=max_length
    )


def tiny_vae(**extra: Any) -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, **{**TINY_PIXART["vae"], **extra})


def pixart_pipeline(
    shape: dict[str, dict[str, Any]], words: list[str] = WORDS, max_length: int = 16, device: str = "cpu"
) -> Any:
    """A random-weight PixArt-alpha pipeline of ``shape`` over a word-level vocabulary, made on ``device`` (random
    init there takes seconds instead of minutes at 600M parameters)."""
    from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    with torch.device(device):
        text_encoder = T5EncoderModel(T5Config(vocab_size=len(words), pad_token_id=0, eos_token_id=1, **shape["t5"]))
        transformer = PixArtTransformer2DModel(**shape["transformer"])
        vae = AutoencoderKL(in_channels=3, out_channels=3, **shape["vae"])
    return PixArtAlphaPipeline(
        tokenizer=word_tokenizer(words, max_length),
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=DPMSolverMultistepScheduler(),
    )


def save_tiny_pixart(path: Path) -> Path:
    pixart_pipeline(TINY_PIXART).save_pretrained(path)
    return path


def save_tiny_sd3(path: Path) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)

    def clip() -> CLIPTextModelWithProjection:
        return CLIPTextModelWithProjection(
            CLIPTextConfig(
                vocab_size=len(WORDS),
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                projection_dim=16,
                max_position_embeddings=16,
                pad_token_id=0,
                eos_token_id=1,
                bos_token_id=1,
            )
        )

    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=16,
        pooled_projection_dim=32,
        out_channels=4,
        pos_embed_max_size=16,
    )
    # SD3 runs without its T5 encoder (zeros in its place); saved as [null, null] in model_index.json.
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=tiny_vae(shift_factor=0.0609, scaling_factor=1.5035),
        text_encoder=clip(),
        tokenizer=word_tokenizer(),
        text_encoder_2=clip(),
        tokenizer_2=word_tokenizer(),
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipe.save_pretrained(path)
    return path
