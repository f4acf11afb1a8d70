"""A tiny random Qwen2.5-Omni checkpoint (thinker, talker, token2wav and a speaker map) saved to disk, so
tests load it the way users load the real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

THINKER_VOCAB = 384  # fits tests.harness.checkpoints.byte_level_tokenizer
CODEC_VOCAB = 40  # codec ids; the last few are the talker's special tokens
SPEAKERS = ("Chelsie", "Ethan")


def tiny_omni_config() -> Any:
    from transformers import Qwen2_5OmniConfig

    text = dict(
        vocab_size=THINKER_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
        tie_word_embeddings=False,
    )
    thinker = dict(
        text_config=text,
        audio_config=dict(
            num_mel_bins=16,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=32,
            d_model=16,
            output_dim=32,
            n_window=4,
            max_source_positions=64,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            fullatt_block_indexes=[0],
            window_size=28,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        audio_token_index=150,
        image_token_index=151,
        video_token_index=152,
        audio_start_token_id=153,
        audio_end_token_id=154,
        vision_start_token_id=155,
        vision_end_token_id=156,
        user_token_id=100,
    )
    talker = dict(
        vocab_size=CODEC_VOCAB,
        embedding_size=32,
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
        tts_codec_pad_token_id=CODEC_VOCAB - 4,
        tts_codec_start_token_id=CODEC_VOCAB - 3,
        tts_codec_end_token_id=CODEC_VOCAB - 2,
        tts_codec_mask_token_id=CODEC_VOCAB - 1,
        tts_text_start_token_id=157,
        tts_text_end_token_id=158,
        tts_text_pad_token_id=159,
        audio_token_index=150,
        image_token_index=151,
        video_token_index=152,
        audio_start_token_id=153,
        audio_end_token_id=154,
        vision_start_token_id=155,
        vision_end_token_id=156,
    )
    token2wav = dict(
        dit_config=dict(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            head_dim=16,
            ff_mult=2,
            emb_dim=16,
            block_size=4,
            look_ahead_layers=[1],
            look_backward_layers=[0],
            repeats=2,
            num_embeds=CODEC_VOCAB,
            mel_dim=8,
            enc_emb_dim=8,
            enc_dim=8,
            enc_channels=[8, 8, 8, 8, 24],
            enc_attention_channels=8,
            enc_se_channels=8,
            max_position_embeddings=4096,
        ),
        bigvgan_config=dict(
            mel_dim=8,
            upsample_initial_channel=16,
            resblock_kernel_sizes=[3, 7],
            resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
            upsample_rates=[4, 2],
            upsample_kernel_sizes=[8, 4],
        ),
    )
    return Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker, token2wav_config=token2wav)


def save_tiny_omni(path: Path, seed: int = 0) -> Path:
    """A random tiny ``Qwen2_5OmniForConditionalGeneration`` saved under ``path`` with ``spk_dict.pt``."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)
    config = tiny_omni_config()
    model = Qwen2_5OmniForConditionalGeneration(config)
    # Random init leaves small weights everywhere: widen the codec head so greedy codes vary, and
    # raise the vocoder's output to speech level (otherwise it is ~1e-4, below any useful tolerance).
    with torch.no_grad():
        model.talker.codec_head.weight.normal_(0.0, 1.0)
        model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(300.0)
    model.save_pretrained(path)
    mel_dim = config.token2wav_config.dit_config.mel_dim
    enc_emb = config.token2wav_config.dit_config.enc_emb_dim
    speakers = {
        name: {"cond": torch.randn(enc_emb), "ref_mel": torch.randn(1, 12, mel_dim), "bos_token": 157}
        for name in SPEAKERS
    }
    torch.save(speakers, path / "spk_dict.pt")
    return path


def save_tiny_thinker_text(omni_dir: Path, path: Path) -> Path:
    """The thinker's text model of a saved tiny Omni checkpoint as a plain Qwen2 checkpoint with a tokenizer:
    what the engine serves as the thinker until it loads Omni checkpoints itself."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, Qwen2ForCausalLM

    from tests.harness.checkpoints import byte_level_tokenizer

    text = AutoConfig.from_pretrained(omni_dir).thinker_config.text_config
    config = thinker_as_qwen2(text, eos_token_id=0, bos_token_id=1)
    state = thinker_weights_as_qwen2(load_file(str(omni_dir / "model.safetensors")))
    model = Qwen2ForCausalLM(config)
    model.load_state_dict(state, strict=True)
    model.save_pretrained(path)
    byte_level_tokenizer().save_pretrained(path)
    return path


def thinker_as_qwen2(text: Any, **overrides: Any) -> Any:
    """A ``Qwen2Config`` of the thinker's text config ``text``: the plain Qwen2 model it is for text."""
    from transformers import Qwen2Config

    fields = dict(
        vocab_size=text.vocab_size,
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        num_hidden_layers=text.num_hidden_layers,
        num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads,
        max_position_embeddings=text.max_position_embeddings,
        rms_norm_eps=text.rms_norm_eps,
        tie_word_embeddings=False,
    )
    return Qwen2Config(**{**fields, **overrides})


def thinker_weights_as_qwen2(state: dict[str, Any]) -> dict[str, Any]:
    """The thinker's text-model weights of an Omni state dict under Qwen2's names. In memory they sit under
    ``thinker.model.language_model.``; saved (and in older transformers releases), under ``thinker.model.``."""
    prefix = "thinker.model.language_model."
    if f"{prefix}embed_tokens.weight" not in state:
        prefix = "thinker.model."
    weights = {"model." + k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    weights["lm_head.weight"] = state["thinker.lm_head.weight"]
    return weights
