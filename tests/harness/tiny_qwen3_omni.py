"""A tiny random Qwen3-Omni checkpoint (``Qwen3OmniMoeForConditionalGeneration``: thinker, talker and code2wav)
built from transformers' own config and model classes and saved with ``save_pretrained``, with the small trained
tokenizer of tests/harness/audio_checkpoints.py and the feature extractor / image processor the towers read.

The thinker is a 2-layer Qwen3-MoE decoder (8 experts, top-2) with interleaved M-RoPE, a 2-layer audio encoder over
128 mel bins and a 2-layer Qwen3-VL vision tower with one DeepStack layer; the talker (MoE with a shared expert and
its code predictor) and code2wav are as small as their configs allow, so a test builds the whole thing in a second.

With ``speech=True`` the talker's vocabulary keeps Qwen3-Omni's layout and its heads are tuned so greedy speech runs
on with varied frames (``tune_for_speech``), the checkpoint the speech tests load; ``chat_ids`` writes its prompts.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tests.harness.audio_checkpoints import SAMPLE_RATE, audio_tokenizer, token_id
from tests.harness.model_shapes import fill_fused_experts

HIDDEN = 64
MEL_BINS = 128  # what WhisperFeatureExtractor(feature_size=128) makes, as Qwen3-Omni's processor does
AUDIO_WINDOW_S = 4  # seconds of audio per feature-extractor chunk (30 in the real checkpoint)
CODE_GROUPS = 4  # codebooks per codec frame (16 in the real checkpoint)
CODEC_VOCAB = 64  # codec ids; the last few are the talker's special tokens (but with speech=True)

# Thinker ids of Qwen's chat markup: after the audio tokenizer's specials (ids 0-9), see ``chatml_tokenizer``.
USER, IM_START, IM_END, TTS_PAD, TTS_BOS, TTS_EOS, SYSTEM, ASSISTANT = range(10, 18)


def _media_ids() -> dict[str, int]:
    return dict(
        audio_token_id=token_id("<|AUDIO|>"),
        image_token_id=token_id("<|IMAGE|>"),
        video_token_id=token_id("<|VIDEO|>"),
        audio_start_token_id=token_id("<|audio_bos|>"),
        vision_start_token_id=token_id("<|vision_bos|>"),
    )


def thinker_text_config(**extra: Any) -> dict[str, Any]:
    """The thinker's ``text_config`` fields (``extra`` adds or replaces some)."""
    # A wide init keeps logits well apart, so greedy ties cannot flip on float rounding.
    return (
        dict(
            vocab_size=512,
            hidden_size=HIDDEN,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
                "interleaved": True,
                "mrope_interleaved": True,
            },
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            initializer_range=0.3,
            eos_token_id=0,
            bos_token_id=1,
        )
        | extra
    )


def tiny_qwen3_omni_config(*, enable_audio_output: bool = True, speech: bool = False, **thinker_overrides: Any) -> Any:
    """The ``Qwen3OmniMoeConfig`` of the tiny checkpoint; ``thinker_overrides`` replace thinker fields. ``speech``:
    the talker's vocabulary has Qwen3-Omni's layout (``CODEC_VOCAB`` codes, then 1024 special ids that generate
    suppresses but for the codec end), so its greedy speech runs on (see ``tune_for_speech``)."""
    from transformers import Qwen3OmniMoeConfig

    thinker = dict(
        text_config=thinker_text_config(),
        audio_config=dict(
            num_mel_bins=MEL_BINS,
            encoder_layers=2,
            encoder_attention_heads=2,
            encoder_ffn_dim=64,
            d_model=32,
            output_dim=HIDDEN,
            downsample_hidden_size=8,
            n_window=50,
            n_window_infer=200,  # attention windows of 2 s (8 s in the real checkpoint)
            conv_chunksize=500,
            max_source_positions=1500,
            initializer_range=0.3,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=HIDDEN,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
            initializer_range=0.3,
        ),
        position_id_per_seconds=25,
        user_token_id=USER,
        initializer_range=0.3,
        **_media_ids(),
    )
    thinker.update(thinker_overrides)
    talker_text = dict(
        vocab_size=CODEC_VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=2048,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [1, 1, 2],
            "interleaved": True,
        },
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
    )
    code_predictor = dict(
        vocab_size=CODEC_VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        num_code_groups=CODE_GROUPS,
    )
    codec = dict(
        codec_eos_token_id=CODEC_VOCAB - 6,
        codec_pad_id=CODEC_VOCAB - 5,
        codec_bos_id=CODEC_VOCAB - 4,
        codec_nothink_id=CODEC_VOCAB - 3,
        codec_think_bos_id=CODEC_VOCAB - 2,
        codec_think_eos_id=CODEC_VOCAB - 1,
        speaker_id={"ethan": CODEC_VOCAB - 8, "chelsie": CODEC_VOCAB - 7},
    )
    if speech:
        talker_text["vocab_size"] = vocab = CODEC_VOCAB + 1024
        codec = dict(
            codec_eos_token_id=CODEC_VOCAB + 6,
            codec_pad_id=CODEC_VOCAB + 4,
            codec_bos_id=CODEC_VOCAB + 5,
            codec_nothink_id=CODEC_VOCAB + 11,
            codec_think_bos_id=CODEC_VOCAB + 12,
            codec_think_eos_id=CODEC_VOCAB + 13,
            speaker_id={"ethan": vocab - 1, "chelsie": vocab - 2},
        )
    talker = dict(
        text_config=talker_text,
        code_predictor_config=code_predictor,
        num_code_groups=CODE_GROUPS,
        thinker_hidden_size=HIDDEN,
        accept_hidden_layer=1,
        **codec,
        spatial_merge_size=2,
        position_id_per_seconds=25,
        **_media_ids(),
    )
    code2wav = dict(
        codebook_size=CODEC_VOCAB,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=48,
        num_hidden_layers=1,
        num_quantizers=CODE_GROUPS,
        sliding_window=8,
        upsample_rates=[4, 2],
        upsampling_ratios=[2, 2],
        decoder_dim=32,
    )
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=enable_audio_output,
        im_start_token_id=IM_START,
        im_end_token_id=IM_END,
        tts_pad_token_id=TTS_PAD,
        tts_bos_token_id=TTS_BOS,
        tts_eos_token_id=TTS_EOS,
        system_token_id=SYSTEM,
        user_token_id=USER,
        assistant_token_id=ASSISTANT,
    )


def feature_extractor() -> Any:
    """Qwen3-Omni's audio features: Whisper log-mel with 128 bins at 16 kHz (chunks shortened for tests)."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE, chunk_length=AUDIO_WINDOW_S)


def _image_processor() -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=16, min_pixels=32 * 32, max_pixels=128 * 128)


# After the audio tokenizer's specials (ids 0-9), the chat markers at the ids the config names (USER ... ASSISTANT):
# the talker's prompt is cut by <|im_start|> and the role that follows it.
_CHATML_SPECIALS = [
    "user",
    "<|im_start|>",
    "<|im_end|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
    "system",
    "assistant",
]
_CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def chatml_tokenizer() -> Any:
    """The audio tokenizer with Qwen's chat markup (``<|im_start|>role``) as single tokens at the config's ids."""
    from tests.harness.audio_checkpoints import AUDIO_CORPUS, AUDIO_SPECIALS
    from tests.harness.checkpoints import _trained_byte_level

    tok = _trained_byte_level(AUDIO_CORPUS, 330, AUDIO_SPECIALS + _CHATML_SPECIALS)
    tok.chat_template = _CHATML_TEMPLATE
    assert tok.convert_tokens_to_ids(_CHATML_SPECIALS) == list(range(USER, ASSISTANT + 1))
    return tok


def chat_ids(user: Sequence[int], reply: Sequence[int] = (), system: Sequence[int] = (20, 21)) -> list[int]:
    """Thinker ids of a system turn, one user turn and the assistant's turn opened with ``reply`` (content ids from
    18 up are plain text; below are specials, media placeholders among them)."""
    nl = chatml_tokenizer().convert_tokens_to_ids("Ċ")  # byte-level "\n"
    return (
        [IM_START, SYSTEM, nl, *system, IM_END, nl]
        + [IM_START, USER, nl, *user, IM_END, nl]
        + [IM_START, ASSISTANT, nl, *reply]
    )


def tune_for_speech(model: Any) -> Any:
    """Random init leaves small heads: widen them so greedy codes vary from step to step, and give code2wav's
    transformer and vocoder weight enough that a wrong context shows in the waveform."""
    codec_eos = model.config.talker_config.codec_eos_token_id
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


def save_tiny_qwen3_omni(directory: Path, seed: int = 0, **config_overrides: Any) -> Any:
    """A random tiny ``Qwen3OmniMoeForConditionalGeneration`` saved under ``directory`` (talker and code2wav
    included unless ``enable_audio_output=False``), with tokenizer and ``preprocessor_config.json``.

    Returns the model (``.thinker`` is the ``Qwen3OmniMoeThinkerForConditionalGeneration`` whose text HF
    generates)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(tiny_qwen3_omni_config(**config_overrides)).eval()
    fill_fused_experts(model, std=0.3)
    if config_overrides.get("speech"):
        tune_for_speech(model)
    model.save_pretrained(directory)
    (chatml_tokenizer() if config_overrides.get("speech") else audio_tokenizer()).save_pretrained(directory)
    # One preprocessor_config.json serves both, as in the released checkpoint.
    merged = {**_image_processor().to_dict(), **feature_extractor().to_dict()}
    (directory / "preprocessor_config.json").write_text(json.dumps(merged, indent=2))
    return model
