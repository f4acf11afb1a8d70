"""Audio towers on their own: the HF reference embeddings, resampling, refusals, the content-keyed cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.audio_tower import (
    AudioEncoder,
    AudioLoadError,
    UnusableAudio,
    checkpoint_family,
    load_audio_encoder,
)
from omni_gateway.encoders.cache import EncoderCache

from tests.harness.audio_checkpoints import (
    SAMPLE_RATE,
    save_tiny_qwen2_5_omni,
    save_tiny_qwen2_audio,
    save_tiny_voxtral,
    tone,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    directory = tmp_path_factory.mktemp("qwen2audio")
    return directory, save_tiny_qwen2_audio(directory)


@pytest.fixture
def encoder(tiny: tuple[Path, Any]) -> AudioEncoder:
    return load_audio_encoder(tiny[0], cache=EncoderCache(64 << 20))


def test_embeddings_equal_what_the_hf_model_feeds_its_language_model(
    tiny: tuple[Path, Any], encoder: AudioEncoder
) -> None:
    _, hf = tiny
    clip = tone(1, 0.55)
    batch = encoder.extractor(
        clip, sampling_rate=SAMPLE_RATE, padding="max_length", return_attention_mask=True, return_tensors="pt"
    )
    frames = int(batch["attention_mask"].sum())
    n = ((frames - 1) // 2 + 1 - 2) // 2 + 1  # the processor's token count
    seen: dict[str, torch.Tensor] = {}

    def capture(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen["embeds"] = kwargs["inputs_embeds"]

    handle = hf.model.language_model.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        with torch.inference_mode():
            hf.model(
                input_ids=torch.full((1, n), hf.config.audio_token_id),
                input_features=batch["input_features"],
                feature_attention_mask=batch["attention_mask"],
                use_cache=False,
            )
    finally:
        handle.remove()
    features = encoder.encode(clip, SAMPLE_RATE)
    assert features.num_tokens == n
    torch.testing.assert_close(features.embeds, seen["embeds"][0], rtol=1e-5, atol=1e-5)


def test_any_rate_is_resampled_and_the_cache_is_keyed_by_content(encoder: AudioEncoder) -> None:
    clip = tone(2, 0.5, rate=44100)
    first = encoder.encode(clip, 44100)
    assert encoder.cache.misses == 1
    again = encoder.encode(clip.copy(), 44100)
    assert again is first and encoder.cache.hits == 1  # same samples, no second encode
    other = encoder.encode(tone(3, 0.5, rate=44100), 44100)
    assert other.key != first.key and other.num_tokens == first.num_tokens
    at_16k = encoder.prepare(clip, 44100)
    assert abs(at_16k.size - round(clip.size * SAMPLE_RATE / 44100)) <= 1
    assert encoder.encode(at_16k, SAMPLE_RATE).key == first.key  # the key is over what the tower hears


@pytest.mark.parametrize(
    "samples, rate, message",
    [
        (np.zeros(0, np.float32), SAMPLE_RATE, "no samples"),
        (np.full(100, np.nan, np.float32), SAMPLE_RATE, "NaN or infinite"),
        (np.zeros((2, 100), np.float32), SAMPLE_RATE, "mono"),
        (np.zeros(100, np.float32), 0, "sample rate must be positive"),
        (np.zeros(SAMPLE_RATE + 1, np.float32), SAMPLE_RATE, "at most 1 s per clip"),
        # nothing left once resampled, and too short for one audio token
        (np.zeros(10, np.float32), 384_000, r"audio is 0\.0 ms at this model's 16000 Hz; .* at least 20\.1 ms"),
        (np.zeros(300, np.float32), SAMPLE_RATE, r"audio is 18\.8 ms .* at least 20\.1 ms"),
    ],
)
def test_unusable_audio_is_refused_with_a_clear_error(
    encoder: AudioEncoder, samples: np.ndarray, rate: int, message: str
) -> None:
    with pytest.raises(UnusableAudio, match=message):
        encoder.encode(samples, rate)


def test_directories_without_an_audio_tower_are_refused(tmp_path: Path, tiny: tuple[Path, Any]) -> None:
    from tests.harness.checkpoints import save_tiny_checkpoint

    save_tiny_checkpoint("qwen2", tmp_path / "text")
    assert checkpoint_family(tmp_path / "text") is None
    with pytest.raises(AudioLoadError, match="not an audio-in checkpoint"):
        load_audio_encoder(tmp_path / "text")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny[0] / "config.json").read_text())
    with pytest.raises(AudioLoadError, match="no \\*.safetensors"):
        load_audio_encoder(broken)
    (broken / "config.json").write_text(json.dumps({"architectures": ["Qwen2AudioForConditionalGeneration"]}))
    assert checkpoint_family(broken) == "qwen2_audio"


@pytest.mark.parametrize("save", [save_tiny_qwen2_audio, save_tiny_voxtral, save_tiny_qwen2_5_omni])
def test_the_shortest_clip_heard_is_the_first_with_an_embedding(tmp_path: Path, save: Any) -> None:
    """``embeddings_for`` counts what the tower makes, so the refusal of shorter clips is exact: the shortest
    clip accepted gives an embedding, one sample less is refused with the shortest length named."""
    save(tmp_path)
    encoder = load_audio_encoder(tmp_path, cache=EncoderCache(1 << 20))
    shortest = encoder.shortest_samples()
    for samples in (shortest, shortest + 159, shortest + 1000):
        clip = tone(samples, 1.0)[:samples]
        assert encoder.encode(clip, SAMPLE_RATE).embeds.shape[0] == encoder.embeddings_for(samples) >= 1
    if shortest > 1:
        with pytest.raises(UnusableAudio, match=f"at least {1000 * shortest / SAMPLE_RATE:.1f} ms"):
            encoder.encode(tone(0, 1.0)[: shortest - 1], SAMPLE_RATE)
