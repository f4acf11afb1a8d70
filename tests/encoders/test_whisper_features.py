"""Whisper's log-mel spectrogram on the model's device against Hugging Face's feature extractor."""

from __future__ import annotations

import numpy as np
import pytest
from omni_gateway.encoders.whisper_features import WhisperLogMel

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def extractor(bins: int):  # type: ignore[no-untyped-def]
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=bins)


def utterances(*seconds: float) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(0.1 * rng.standard_normal(int(16000 * s))).astype(np.float32) for s in seconds]


@pytest.mark.parametrize("bins", [80, 128])
def test_a_batch_equals_the_extractors_features(bins: int) -> None:
    import torch

    hf = extractor(bins)
    # a short window, a silent one, one of exactly 30 s and one cut to 30 s
    windows = utterances(2.3, 0.0, 30.0, 31.5)
    ours = WhisperLogMel(hf, "cpu")(windows)
    expected = hf(windows, sampling_rate=16000, return_tensors="pt").input_features
    assert ours.shape == expected.shape == (4, bins, 3000)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


def test_one_window_is_a_batch_of_one() -> None:
    import torch

    hf = extractor(80)
    (window,) = utterances(1.7)
    expected = hf(window, sampling_rate=16000, return_tensors="pt").input_features
    torch.testing.assert_close(WhisperLogMel(hf, "cpu")(window), expected, rtol=0, atol=1e-6)


def test_no_window_is_refused() -> None:
    with pytest.raises(ValueError, match="expected at least one window"):
        WhisperLogMel(extractor(80), "cpu")([])


@pytest.mark.gpu
def test_the_gpu_spectrogram_stays_there_and_matches_the_cpu_one() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    hf = extractor(128)
    windows = utterances(2.0, 4.5, 12.0)
    on_gpu = WhisperLogMel(hf, "cuda")(windows)
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), WhisperLogMel(hf, "cpu")(windows), rtol=0, atol=1e-3)
