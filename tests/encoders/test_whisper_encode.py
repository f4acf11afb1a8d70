"""Whisper's encoder replayed from CUDA graphs (one per batch bucket) against the eager encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer
from omni_gateway.encoders.whisper_encode import GraphedWhisperEncoder

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def windows(recognizer: TorchWhisperRecognizer, rows: int, seed: int):  # type: ignore[no-untyped-def]
    import torch

    generator = torch.Generator().manual_seed(seed)
    shape = (rows, recognizer.model.config.num_mel_bins, 3000)
    return torch.randn(shape, generator=generator).to(recognizer.device, recognizer.model.dtype)


def eager(recognizer: TorchWhisperRecognizer, features):  # type: ignore[no-untyped-def]
    return recognizer.model.get_encoder()(features).last_hidden_state


def test_the_encoder_runs_eagerly_on_a_cpu(tiny_en: Path) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu", encoder_graphs=True)
    assert not recognizer._encoder.graphs
    with torch.inference_mode():
        features = windows(recognizer, 3, 0)
        assert torch.equal(recognizer._encode(features), eager(recognizer, features))


def test_buckets_pad_to_at_most_a_third_and_end_at_the_largest_batch() -> None:
    import torch

    encoder = torch.nn.Linear(2, 2)
    encoder.config = type("Config", (), {"max_source_positions": 1500, "num_mel_bins": 80})()
    graphed = GraphedWhisperEncoder(encoder, max_rows=20, graphs=False)
    assert graphed.buckets == (1, 2, 3, 4, 6, 8, 12, 16, 20)
    for rows in range(1, 21):
        bucket = next(b for b in graphed.buckets if b >= rows)
        assert bucket - rows <= bucket / 3
    with pytest.raises(ValueError, match="max_rows must be at least 1; got 0"):
        GraphedWhisperEncoder(encoder, max_rows=0, graphs=False)


def test_a_failed_capture_encodes_eagerly(tiny_en: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu")
    recognizer._encoder._capture_all()  # capturing needs a CUDA stream, which this CPU build lacks
    assert not recognizer._encoder.graphs
    assert "CUDA graph capture of the encoder failed" in caplog.text
    with torch.inference_mode():
        features = windows(recognizer, 2, 1)
        assert torch.equal(recognizer._encode(features), eager(recognizer, features))


@pytest.mark.gpu
def test_replayed_encoder_matches_the_eager_one(tiny_en: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    recognizer = TorchWhisperRecognizer(tiny_en, device="cuda", dtype="float32", max_batch=6)
    encoder = recognizer._encoder
    assert encoder.graphs and encoder.buckets == (1, 2, 3, 4, 6)
    with torch.inference_mode():
        for rows, seed in ((5, 0), (3, 1), (1, 2), (5, 3), (13, 4)):  # padded buckets, stale rows, parts
            features = windows(recognizer, rows, seed)
            replayed = recognizer._encode(features)
            assert replayed.shape == (rows, 1500, recognizer.model.config.d_model)
            torch.testing.assert_close(replayed, eager(recognizer, features), rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match=r"takes \[rows, 80, 3000\]; got \[1, 80, 2999\]"):
            recognizer._encode(windows(recognizer, 1, 0)[:, :, :2999])
