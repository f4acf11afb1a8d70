"""Whisper's static-cache decode (one fixed-shape step per token, a CUDA graph on CUDA) against the dynamic one."""

from __future__ import annotations

from pathlib import Path

import pytest
from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer
from omni_gateway.encoders.whisper_decode import STEPS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
EOS = 50256


def dynamic(recognizer: TorchWhisperRecognizer, encoded, prefix: list[int]) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """The same recognizer's decode over Hugging Face's dynamic cache, rows leaving as they end."""
    static, recognizer._static = recognizer._static, None
    try:
        return recognizer._decode(encoded, prefix)
    finally:
        recognizer._static = static


def rows_that_end_apart(recognizer: TorchWhisperRecognizer, rows: int):  # type: ignore[no-untyped-def]
    """Encoder states the random decoder listens to, with end-of-text made likely: rows end at different steps."""
    import torch

    torch.manual_seed(0)
    for layer in recognizer.model.model.decoder.layers:
        layer.encoder_attn.out_proj.weight *= 5
    encoded = torch.randn(rows, 1500, 32, dtype=recognizer.model.dtype, device=recognizer.device) * 3
    prefix = recognizer._prefix([], "en")
    spoken = [t for row in dynamic(recognizer, encoded, prefix) for t in row[3:]]
    weights = recognizer.model.proj_out.weight
    weights[EOS] = weights[max(set(spoken), key=spoken.count)] * 1.02
    return encoded, prefix


@pytest.mark.parametrize("rows", [1, 3, 6])
def test_static_cache_decodes_what_the_dynamic_cache_does(tiny_multi: Path, rows: int) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_multi, device="cpu", max_new_tokens=30, static_cache=True)
    with torch.inference_mode():
        encoded, prefix = rows_that_end_apart(recognizer, rows)
        expected = dynamic(recognizer, encoded, prefix)
        assert recognizer._decode(encoded, prefix) == expected
        assert recognizer._decode(encoded, prefix) == expected  # the buffers of an earlier batch do not leak in
    if rows == 6:
        assert len({len(row) for row in expected}) > 1, "rows end at different steps"


def test_a_short_budget_stops_every_row_at_it(tiny_multi: Path) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_multi, device="cpu", max_new_tokens=30, static_cache=True)
    with torch.inference_mode():
        encoded, prefix = rows_that_end_apart(recognizer, 4)
        recognizer.max_new_tokens = 3
        decoded = recognizer._decode(encoded, prefix)
        assert decoded == dynamic(recognizer, encoded, prefix)
        assert max(len(row) for row in decoded) == 3


def test_static_cache_is_the_default_on_cuda_only(tiny_multi: Path) -> None:
    assert TorchWhisperRecognizer(tiny_multi, device="cpu")._static is None


def test_a_failed_graph_capture_decodes_eagerly(tiny_multi: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_multi, device="cpu", max_new_tokens=30, static_cache=True)
    assert recognizer._static is not None
    recognizer._static.graphs = True  # as on CUDA; capturing needs a CUDA stream, which this CPU build lacks
    recognizer._static._capture_all()
    with torch.inference_mode():
        encoded, prefix = rows_that_end_apart(recognizer, 3)
        expected = dynamic(recognizer, encoded, prefix)
        assert recognizer._decode(encoded, prefix) == expected
    assert not recognizer._static.graphs
    assert "CUDA graph capture of the decoder steps failed" in caplog.text


@pytest.mark.gpu
def test_cuda_graph_decode_matches_the_dynamic_cache(tiny_multi: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    recognizer = TorchWhisperRecognizer(tiny_multi, device="cuda", dtype="float32", max_new_tokens=30)
    assert recognizer._static is not None and recognizer._static.graphs
    with torch.inference_mode():
        encoded, prefix = rows_that_end_apart(recognizer, 5)
        expected = dynamic(recognizer, encoded, prefix)
        assert recognizer._decode(encoded, prefix) == expected
        assert recognizer._decode(encoded[:2], prefix) == expected[:2]  # another bucket, its own graph
        assert recognizer._decode(encoded, prefix) == expected  # the captured graph replayed for a new batch
    static = recognizer._static
    assert static.buckets == (1, 2, 4, 8, 16, 32)
    assert all(b.cross_graph and b.steps_graph for b in static._buckets.values())


def test_every_bucket_shares_the_largest_buckets_buffers(tiny_multi: Path) -> None:
    recognizer = TorchWhisperRecognizer(tiny_multi, device="cpu", max_batch=6, static_cache=True)
    static = recognizer._static
    assert static is not None and static.buckets == (1, 2, 4, 6)
    largest = static._buckets[6]
    for rows, bucket in static._buckets.items():
        assert bucket.cross_k[0].shape[0] == rows
        assert bucket.cross_k[0].data_ptr() == largest.cross_k[0].data_ptr()
        assert bucket.self_v[-1].data_ptr() == largest.self_v[-1].data_ptr()


def test_a_prompt_longer_than_a_launch_is_fed_a_step_at_a_time(tiny_multi: Path) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_multi, device="cpu", max_new_tokens=30, static_cache=True)
    with torch.inference_mode():
        encoded, prefix = rows_that_end_apart(recognizer, 3)
        prompt = "a table for two people tonight, near the window, for the birthday of my oldest friend"
        prompted = recognizer._prompt_ids(prompt) + prefix
        assert len(prompted) > 2 * STEPS
        assert recognizer._decode(encoded, prompted) == dynamic(recognizer, encoded, prompted)


def test_rows_that_never_end_decode_up_to_the_last_position(tiny_multi: Path) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_multi, device="cpu", max_new_tokens=10_000, static_cache=True)
    torch.manual_seed(1)
    with torch.inference_mode():
        encoded = torch.randn(2, 1500, 32)
        prefix = recognizer._prefix([], "en")
        decoded = recognizer._decode(encoded, prefix)
        assert decoded == dynamic(recognizer, encoded, prefix)
        assert [len(row) for row in decoded] == [recognizer.model.config.max_target_positions - len(prefix)] * 2
