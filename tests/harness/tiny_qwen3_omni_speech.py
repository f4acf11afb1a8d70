"""A tiny random Qwen3-Omni checkpoint (thinker, MoE talker with its code predictor, code2wav) saved to disk,
for tests of the speech side: they load it the way users load the real one.

The talker's vocabulary keeps Qwen3-Omni's layout: codes below ``CODEBOOK`` are sounds, its last 1024 ids are
special tokens (Hugging Face's generate suppresses all of them but the codec end), so it is 1024 + ``CODEBOOK``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.harness.model_shapes import fill_fused_experts

THINKER_VOCAB = 256
CODEBOOK = 64  # codes per codebook (code predictor and code2wav)
TALKER_VOCAB = 1024 + CODEBOOK
CODE_GROUPS = 4  # codebooks per frame: the talker's one, then the code predictor's three
SPEAKERS = {"chelsie": TALKER_VOCAB - 2, "ethan": TALKER_VOCAB - 1}

# Thinker-side special ids (all below THINKER_VOCAB).
IM_START, IM_END, SYSTEM, USER, ASSISTANT = 200, 201, 205, 206, 207
TTS_PAD, TTS_BOS, TTS_EOS = 202, 203, 204
AUDIO, IMAGE, VIDEO = 210, 211, 212

# Talker codec specials (Qwen3-Omni puts them right after the codebook in the upper range).
CODEC_PAD, CODEC_BOS, CODEC_EOS = CODEBOOK + 4, CODEBOOK + 5, CODEBOOK + 6
CODEC_NOTHINK, CODEC_THINK_BOS, CODEC_THINK_EOS = CODEBOOK + 11, CODEBOOK + 12, CODEBOOK + 13


def tiny_qwen3_omni_config() -> Any:
    from transformers import Qwen3OmniMoeConfig

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "interleaved": True}
    text = dict(
        vocab_size=THINKER_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        rope_parameters=rope,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
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
            n_window_infer=8,
            max_source_positions=64,
            downsample_hidden_size=8,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        audio_token_id=AUDIO,
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        audio_start_token_id=213,
        vision_start_token_id=214,
        user_token_id=USER,
    )
    talker_text = dict(
        vocab_size=TALKER_VOCAB,
        hidden_size=32,
        intermediate_size=48,  # also the width of the thinker -> talker projections
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        rope_parameters=rope,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
    )
    predictor = dict(
        vocab_size=CODEBOOK,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_code_groups=CODE_GROUPS,
    )
    talker = dict(
        text_config=talker_text,
        code_predictor_config=predictor,
        num_code_groups=CODE_GROUPS,
        thinker_hidden_size=32,
        accept_hidden_layer=1,
        codec_eos_token_id=CODEC_EOS,
        codec_pad_id=CODEC_PAD,
        codec_bos_id=CODEC_BOS,
        codec_nothink_id=CODEC_NOTHINK,
        codec_think_bos_id=CODEC_THINK_BOS,
        codec_think_eos_id=CODEC_THINK_EOS,
        audio_token_id=AUDIO,
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        audio_start_token_id=213,
        vision_start_token_id=214,
        speaker_id=dict(SPEAKERS),
        spatial_merge_size=2,
    )
    code2wav = dict(
        codebook_size=CODEBOOK,
        hidden_size=32,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_attention_heads=4,
        num_key_value_heads=4,
        sliding_window=5,  # short, so streamed chunks reach past it
        intermediate_size=48,
        num_hidden_layers=2,
        num_quantizers=CODE_GROUPS,
        upsample_rates=[4, 2],
        upsampling_ratios=[2, 2],
        decoder_dim=16,
    )
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        im_start_token_id=IM_START,
        im_end_token_id=IM_END,
        tts_pad_token_id=TTS_PAD,
        tts_bos_token_id=TTS_BOS,
        tts_eos_token_id=TTS_EOS,
        system_token_id=SYSTEM,
        user_token_id=USER,
        assistant_token_id=ASSISTANT,
    )


def tiny_qwen3_omni(seed: int = 0) -> Any:
    """The random tiny ``Qwen3OmniMoeForConditionalGeneration`` (float32, eval mode)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_qwen3_omni_config()).float().eval()
    fill_fused_experts(model, std=0.02)
    return tune_for_speech(model, CODEC_EOS)


def tune_for_speech(model: Any, codec_eos: int) -> Any:
    """Random init leaves small weights: widen the heads so greedy codes vary from step to step, and give
    code2wav's transformer and vocoder weight enough that a wrong context shows in the waveform."""
    with torch.no_grad():
        model.talker.codec_head.weight.normal_(0.0, 1.0)
        # A zero logit for the codec's end, well below the largest of the others, so greedy speech runs on.
        model.talker.codec_head.weight[codec_eos].zero_()
        for head in model.talker.code_predictor.lm_head:
            head.weight.normal_(0.0, 1.0)
        for name, param in model.code2wav.named_parameters():
            if name.endswith("layer_scale.scale"):
                param.fill_(1.0)
        model.code2wav.decoder[-1].conv.weight.mul_(4e4)  # otherwise ~1e-6, below any useful tolerance
    return model


def save_tiny_qwen3_omni(path: Path, seed: int = 0) -> Path:
    """``tiny_qwen3_omni(seed)`` saved under ``path`` (config and safetensors)."""
    tiny_qwen3_omni(seed).save_pretrained(path)
    return path


def chat_ids(user: list[int], reply: list[int], system: list[int] = (7, 8)) -> list[int]:
    """Thinker ids of a system turn, one user turn, and the assistant's ``reply`` ending with ``IM_END``."""
    nl = 10
    return (
        [IM_START, SYSTEM, nl, *system, IM_END, nl]
        + [IM_START, USER, nl, *user, IM_END, nl]
        + [IM_START, ASSISTANT, nl, *reply]
    )
