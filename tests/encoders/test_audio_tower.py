"""Audio towers on their own: the HF reference embeddings, resampling, refusals, the content-keyed cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.audio_checkpoint import checkpoint_family
from omni_gateway.encoders.audio_encoder import AudioEncoder, AudioLoadError, UnusableAudio
from omni_gateway.encoders.audio_tower import load_audio_encoder
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


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("omni")
    save_tiny_qwen2_5_omni(directory)
    return directory


def test_a_growing_clip_is_heard_group_by_group_as_the_whole_clip_is(omni_dir: Path) -> None:
    """The Qwen2.5-Omni tower attends within its chunks: each settled reading of a turn still spoken (24 kHz,
    as the realtime API sends it) is the start of the whole turn's encoding, token for token, and the whole
    turn then encodes only the groups no reading settled."""
    from omni_gateway.encoders.audio import resample

    turn = resample(tone(4, 3.9), SAMPLE_RATE, 24000)
    alone = load_audio_encoder(omni_dir, cache=EncoderCache(64 << 20))
    whole = alone.encode(turn, 24000)
    assert alone.chunk_stable and whole.num_tokens == alone.embeddings_for(int(3.9 * SAMPLE_RATE))
    assert len(whole.position_keys) == whole.num_tokens
    one_pass = _tower_in_one_pass(alone, alone.prepare(turn, 24000))
    torch.testing.assert_close(whole.embeds, one_pass, rtol=1e-5, atol=1e-5)

    streamed = load_audio_encoder(omni_dir, cache=EncoderCache(64 << 20))
    with pytest.raises(UnusableAudio, match="settled"):  # a group is 1 s of this tower's frames
        streamed.encode(turn[: int(0.9 * 24000)], 24000, settled_only=True)
    heard = 0
    for seconds in (1.2, 2.1, 3.1):
        reading = streamed.encode(turn[: int(seconds * 24000)], 24000, settled_only=True)
        assert reading.num_tokens > heard  # each reading settles more of the turn
        heard = reading.num_tokens
        assert torch.equal(reading.embeds, whole.embeds[:heard])
        assert reading.position_keys == whole.position_keys[:heard]
    misses = streamed.cache.misses
    at_end = streamed.encode(turn, 24000)
    assert torch.equal(at_end.embeds, whole.embeds) and at_end.position_keys == whole.position_keys
    groups = -(-streamed.mel(streamed.prepare(turn, 24000)).shape[1] // streamed.group_frames)
    encoded_at_end = streamed.cache.misses - misses - 1  # less the whole clip's own entry
    assert encoded_at_end < groups and encoded_at_end <= 2  # the tail only


def test_a_louder_continuation_changes_the_keys_of_what_it_changes(omni_dir: Path) -> None:
    """The log-mel floor follows the clip's loudest frame: a start read quietly is encoded again once a
    louder continuation lifts the floor, never taken from its stale reading."""
    quiet = np.concatenate([np.zeros(8000, np.float32), 0.001 * tone(5, 1.5)])
    turn = np.concatenate([quiet, tone(6, 1.5)])
    encoder = load_audio_encoder(omni_dir, cache=EncoderCache(64 << 20))
    early = encoder.encode(quiet, SAMPLE_RATE, settled_only=True)
    at_end = encoder.encode(turn, SAMPLE_RATE)
    fresh = load_audio_encoder(omni_dir, cache=EncoderCache(64 << 20)).encode(turn, SAMPLE_RATE)
    assert torch.equal(at_end.embeds, fresh.embeds)
    assert early.position_keys != at_end.position_keys[: early.num_tokens]


def test_towers_that_attend_across_the_window_hear_no_growing_clip(encoder: AudioEncoder) -> None:
    assert not encoder.chunk_stable
    with pytest.raises(UnusableAudio, match="hears a clip only whole"):
        encoder.encode(tone(1, 0.8), SAMPLE_RATE, settled_only=True)


def _tower_in_one_pass(encoder: Any, samples: np.ndarray) -> torch.Tensor:
    """The tower over the clip's whole mel at once, as the thinker runs it."""
    mel = encoder.mel(samples)
    lengths = torch.tensor([mel.shape[1]])
    after_cnn, _ = encoder.tower._get_feat_extract_output_lengths(lengths)
    with torch.inference_mode():
        return encoder.tower(mel, feature_lens=lengths, aftercnn_lens=after_cnn).last_hidden_state
