"""Tiny random audio-in checkpoints (Qwen2-Audio, Voxtral, Qwen2.5-Omni, Qwen2.5-VL) saved with
``save_pretrained``, with a small trained tokenizer that knows their media tokens and the feature
extractor / image processor their towers read. Windows are shrunk (1 s of audio per encoder window
instead of 30 s) so a test runs the whole tower in milliseconds.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.harness.checkpoints import _text_config, _trained_byte_level

AUDIO_SPECIALS = [
    "<eos>",
    "<bos>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "[BEGIN_AUDIO]",
]
AUDIO_CORPUS = [
    "user: what is said in this recording, transcribe it please",
    "assistant: somebody says hello and the dog barks",
    "describe the sound and the picture of the video",
    "the quick brown fox jumps over the lazy dog",
] * 4
SAMPLE_RATE = 16000
WINDOW_S = 1  # seconds of audio per encoder window (30 in the real checkpoints)
MEL_FRAMES = WINDOW_S * 100  # hop length 160 at 16 kHz
OMNI_WINDOW_S = 4  # long enough for a video of two 2 s chunks with its sound


@functools.cache
def audio_tokenizer() -> Any:
    return _trained_byte_level(AUDIO_CORPUS, 320, AUDIO_SPECIALS)


def token_id(name: str) -> int:
    return audio_tokenizer().convert_tokens_to_ids(name)


def _feature_extractor(window_s: int = WINDOW_S) -> Any:
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE, chunk_length=window_s)


def _whisper_audio(window_s: int = WINDOW_S, **extra: Any) -> dict[str, Any]:
    return dict(
        num_mel_bins=80,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        d_model=32,
        max_source_positions=window_s * MEL_FRAMES // 2,
        initializer_range=0.3,
        **extra,
    )


def _save(model: Any, directory: Path, *pieces: Any) -> Any:
    model.eval().save_pretrained(directory)
    audio_tokenizer().save_pretrained(directory)
    for piece in pieces:
        piece.save_pretrained(directory)
    return model


def save_tiny_qwen2_audio(directory: Path, seed: int = 0) -> Any:
    """Qwen2-Audio over a 2-layer Qwen2; 1 s of audio -> 25 tokens."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2AudioConfig(
        audio_config=dict(model_type="qwen2_audio_encoder", **_whisper_audio()),
        text_config=dict(model_type="qwen2", **_text_config(512)),
        audio_token_id=token_id("<|AUDIO|>"),
    )
    return _save(Qwen2AudioForConditionalGeneration(config), directory, _feature_extractor())


def save_tiny_voxtral(directory: Path, seed: int = 0) -> Any:
    """Voxtral over a 2-layer Llama; each 2 s window -> 100 frames -> 25 tokens (4 frames per token)."""
    from transformers import VoxtralConfig, VoxtralForConditionalGeneration

    torch.manual_seed(seed)
    config = VoxtralConfig(
        audio_config=dict(model_type="voxtral_encoder", **{**_whisper_audio(2), "encoder_ffn_dim": 128}),
        text_config=dict(model_type="llama", **_text_config(512)),
        audio_token_id=token_id("<|AUDIO|>"),
    )
    return _save(VoxtralForConditionalGeneration(config), directory, _feature_extractor(2))


def _qwen25_vision(**extra: Any) -> dict[str, Any]:
    return {
        **dict(
            depth=2,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
            initializer_range=0.3,
        ),
        **extra,
    }


def _image_processor() -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112)


def _mrope_text(**extra: Any) -> dict[str, Any]:
    return _text_config(
        2048, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}, **extra
    )


def save_tiny_qwen2_5_omni(
    directory: Path,
    seed: int = 0,
    *,
    speaks: bool = False,
    window_s: int = OMNI_WINDOW_S,
    n_window: int = 25,
    text: dict[str, Any] | None = None,
    audio: dict[str, Any] | None = None,
) -> Any:
    """The Qwen2.5-Omni thinker (audio tower with a 4 s window, Qwen2.5-VL vision tower, 2-layer M-RoPE Qwen2),
    without talker; with ``speaks``, also the tiny talker and token2wav of ``tests.harness.tiny_omni`` (widened
    to this thinker) and a speaker map, as a checkpoint that speaks is shipped. ``window_s`` (the audio
    window), ``n_window`` (the tower's attention chunk is twice that in mel frames), ``text`` and ``audio``
    (config fields over the tiny ones) give larger shapes, for timings.

    Returns ``Qwen2_5OmniThinkerForConditionalGeneration`` (the part whose text HF generates)."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    torch.manual_seed(seed)
    text_config = {**_mrope_text(), **(text or {})}
    width = text_config["hidden_size"]
    thinker = dict(
        audio_config={**_whisper_audio(window_s, n_window=n_window, output_dim=width), **(audio or {})},
        vision_config=_qwen25_vision(out_hidden_size=width),
        text_config=text_config,
        audio_token_index=token_id("<|AUDIO|>"),
        image_token_index=token_id("<|IMAGE|>"),
        video_token_index=token_id("<|VIDEO|>"),
        audio_start_token_id=token_id("<|audio_bos|>"),
        audio_end_token_id=token_id("<|audio_eos|>"),
        vision_start_token_id=token_id("<|vision_bos|>"),
        vision_end_token_id=token_id("<|vision_eos|>"),
        initializer_range=0.3,
    )
    config = Qwen2_5OmniConfig(thinker_config=thinker, enable_audio_output=False)
    if speaks:
        config = _speaking(config)
    model = Qwen2_5OmniForConditionalGeneration(config)
    if speaks:
        with torch.no_grad():  # as tests.harness.tiny_omni: varied greedy codes, audio at speech level
            model.talker.codec_head.weight.normal_(0.0, 1.0)
            model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(300.0)
        dit = config.token2wav_config.dit_config
        speakers = {
            name: {"cond": torch.randn(dit.enc_emb_dim), "ref_mel": torch.randn(1, 12, dit.mel_dim), "bos_token": 10}
            for name in ("Chelsie", "Ethan")
        }
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(speakers, directory / "spk_dict.pt")
    _save(model, directory)
    # One preprocessor_config.json serves both, as in the released checkpoints.
    merged = {**_image_processor().to_dict(), **_feature_extractor(window_s).to_dict()}
    (directory / "preprocessor_config.json").write_text(json.dumps(merged, indent=2))
    return model.thinker


def _speaking(config: Any) -> Any:
    """``config`` with the tiny talker and token2wav, the talker reading this thinker's width and ids."""
    from transformers import Qwen2_5OmniConfig

    from tests.harness.tiny_omni import tiny_omni_config

    tiny = tiny_omni_config()
    thinker = config.thinker_config
    ids = {
        name: getattr(thinker, name)
        for name in ("audio_token_index", "image_token_index", "video_token_index")
        + ("audio_start_token_id", "audio_end_token_id", "vision_start_token_id", "vision_end_token_id")
    }
    talker = {
        **tiny.talker_config.to_dict(),
        **ids,
        "embedding_size": thinker.text_config.hidden_size,
        "tts_text_start_token_id": 10,  # ordinary ids of this tokenizer stand for the text start, end, pad
        "tts_text_end_token_id": 11,
        "tts_text_pad_token_id": 12,
    }
    return Qwen2_5OmniConfig(
        thinker_config=thinker.to_dict(),
        talker_config=talker,
        token2wav_config=tiny.token2wav_config.to_dict(),
        enable_audio_output=True,
    )


def save_tiny_qwen2_5_vl(directory: Path, seed: int = 0) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config=_mrope_text(),
        vision_config=_qwen25_vision(tokens_per_second=2),
        image_token_id=token_id("<|IMAGE|>"),
        video_token_id=token_id("<|VIDEO|>"),
        vision_start_token_id=token_id("<|vision_bos|>"),
        vision_end_token_id=token_id("<|vision_eos|>"),
        initializer_range=0.3,
    )
    return _save(Qwen2_5_VLForConditionalGeneration(config), directory, _image_processor())


def tone(seed: int, seconds: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """float32 mono audio: a random mix of tones and noise (distinct seeds give distinct audio)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    wave = sum(rng.uniform(0.1, 0.3) * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) for _ in range(3))
    return (wave + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def video_with_sound(seed: int, video_s: int, audio_s: float, fps: int = 4) -> bytes:
    """A Matroska file: ``video_s`` seconds of random 56x56 frames and ``audio_s`` seconds of 16 kHz pcm16 tones."""
    import io

    import av

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    with av.open(out, "w", format="matroska") as container:
        video = container.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = 56, 56, "yuv420p"
        sound = container.add_stream("pcm_s16le", rate=SAMPLE_RATE, layout="mono")
        for _ in range(video_s * fps):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8), format="rgb24")
            container.mux(video.encode(frame))
        container.mux(video.encode())
        samples = (tone(seed, audio_s) * 20000).astype(np.int16)
        for start in range(0, len(samples), 1600):
            block = av.AudioFrame.from_ndarray(samples[None, start : start + 1600], format="s16", layout="mono")
            block.sample_rate = SAMPLE_RATE
            container.mux(sound.encode(block))
        container.mux(sound.encode())
    return out.getvalue()
