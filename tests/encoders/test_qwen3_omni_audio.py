"""Qwen3-Omni's audio tower on its own: embeddings equal to transformers' thinker's ``get_audio_features`` for
clips of one chunk, several chunks and several attention windows, token counts as the processor counts them,
and the tower's parts (chunking, downsampling arithmetic, placeholders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.encoders.audio_checkpoint import checkpoint_family
from omni_gateway.encoders.audio_encoder import UnusableAudio
from omni_gateway.encoders.audio_tower import load_audio_encoder
from omni_gateway.encoders.qwen3_omni_audio import Qwen3OmniAudioTower, chunk_lengths, frames_after_convs

from tests.harness.audio_checkpoints import SAMPLE_RATE, token_id, tone

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tower(qwen3_omni_thinker: tuple[Path, Any]) -> Qwen3OmniAudioTower:
    encoder = load_audio_encoder(qwen3_omni_thinker[0])
    assert isinstance(encoder, Qwen3OmniAudioTower)
    return encoder


def _hf_embeddings(hf: Any, tower: Qwen3OmniAudioTower, clip: Any) -> torch.Tensor:
    batch = tower.extractor(
        clip, sampling_rate=SAMPLE_RATE, padding=True, truncation=False, return_attention_mask=True, return_tensors="pt"
    )
    with torch.inference_mode():
        return hf.thinker.model.get_audio_features(batch["input_features"], batch["attention_mask"]).last_hidden_state


# 0.3 s: one short chunk; 1 s: one whole chunk; 2.7 s: three chunks, two attention windows (200 frames each);
# 5.3123 s: six chunks, three windows, and a sample count that is no whole number of hops.
@pytest.mark.parametrize("seconds", [0.3, 1.0, 2.7, 5.3123])
def test_embeddings_match_transformers(
    qwen3_omni_thinker: tuple[Path, Any], tower: Qwen3OmniAudioTower, seconds: float
) -> None:
    clip = tone(7, seconds)
    expected = _hf_embeddings(qwen3_omni_thinker[1], tower, clip)
    got = tower.encode(clip, SAMPLE_RATE).embeds
    assert got.shape == expected.shape == (tower.embeddings_for(clip.size), 64)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_token_counts_follow_the_processor() -> None:
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    for frames in (1, 7, 99, 100, 101, 250, 800, 3001):
        counted = sum(frames_after_convs(n) for n in chunk_lengths(frames, 50))
        assert counted == int(_get_feat_extract_output_lengths(torch.tensor(frames)))  # n_window 50, as here
    assert chunk_lengths(250, 50) == [100, 100, 50] and chunk_lengths(200, 50) == [100, 100]


def test_placeholders_and_family(qwen3_omni_thinker: tuple[Path, Any], tower: Qwen3OmniAudioTower) -> None:
    assert checkpoint_family(qwen3_omni_thinker[0]) == "qwen3_omni"
    marks = tower.placeholders
    assert (marks.audio, marks.start, marks.end) == (
        token_id("<|AUDIO|>"),
        token_id("<|audio_bos|>"),
        token_id("<|audio_eos|>"),
    )
    assert tower.max_samples is None, "longer clips than the extractor's window are heard whole"


def test_a_clip_is_encoded_once_and_bad_audio_is_refused(tower: Qwen3OmniAudioTower) -> None:
    clip = tone(3, 0.5)
    first = tower.encode(clip, SAMPLE_RATE)
    assert tower.encode(clip.copy(), SAMPLE_RATE) is first
    with pytest.raises(UnusableAudio, match="NaN"):
        tower.encode(clip * float("nan"), SAMPLE_RATE)


def test_a_growing_clip_is_heard_window_by_window_as_the_whole_clip_is(
    qwen3_omni_thinker: tuple[Path, Any], tower: Qwen3OmniAudioTower
) -> None:
    """The tower attends within windows of ``n_window_infer`` mel frames (2 s here): each settled reading of a turn
    still spoken (24 kHz, as the realtime API sends it) is the start of the whole turn's encoding bit for bit, the
    whole turn equals transformers', and at its end only the windows no reading settled are encoded."""
    from omni_gateway.encoders.audio import resample
    from omni_gateway.encoders.cache import EncoderCache

    turn = resample(tone(4, 5.3), SAMPLE_RATE, 24000)
    alone = load_audio_encoder(qwen3_omni_thinker[0], cache=EncoderCache(64 << 20))
    assert alone.chunk_stable and alone.group_frames == 200
    whole = alone.encode(turn, 24000)
    assert len(whole.position_keys) == whole.num_tokens == alone.embeddings_for(alone.prepare(turn, 24000).size)
    expected = _hf_embeddings(qwen3_omni_thinker[1], tower, alone.prepare(turn, 24000))
    torch.testing.assert_close(whole.embeds, expected, rtol=1e-4, atol=1e-4)

    streamed = load_audio_encoder(qwen3_omni_thinker[0], cache=EncoderCache(64 << 20))
    with pytest.raises(UnusableAudio, match="settled"):  # a window is 2 s of this tower's frames
        streamed.encode(turn[: int(1.9 * 24000)], 24000, settled_only=True)
    heard = 0
    for seconds in (2.2, 3.0, 4.3):
        reading = streamed.encode(turn[: int(seconds * 24000)], 24000, settled_only=True)
        assert reading.num_tokens >= heard and reading.num_tokens % 26 == 0  # whole windows: 2 chunks of 13 tokens
        heard = reading.num_tokens
        assert torch.equal(reading.embeds, whole.embeds[:heard])
        assert reading.position_keys == whole.position_keys[:heard]
    assert heard == 52
    misses = streamed.cache.misses
    at_end = streamed.encode(turn, 24000)
    assert torch.equal(at_end.embeds, whole.embeds) and at_end.position_keys == whole.position_keys
    assert streamed.cache.misses - misses - 1 == 1  # the last, short window only (less the whole clip's entry)
