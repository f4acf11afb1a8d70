"""Whisper transcriptions batched across callers: the same transcripts as one at a time."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from omni_gateway.encoders.asr_batch import BatchedRecognizer
from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer
from omni_gateway.encoders.audio import float_to_pcm16
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline

from tests.omni.test_pipeline import FakeEngine

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
EOS = 50256


def clips() -> list[np.ndarray]:
    """Tones of different pitch and length; one longer than Whisper's 30 s window, one empty."""
    t = np.arange(16000 * 31) / 16000
    shapes = [(1.0, 0.1, 200), (2.0, 0.3, 900), (0.5, 0.05, 3000), (31.0, 0.2, 400), (0.0, 0.1, 100)]
    return [(a * np.sin(2 * np.pi * f * t[: int(16000 * s)])).astype(np.float32) for s, a, f in shapes]


def test_a_batch_decodes_each_row_as_alone_while_rows_finish_at_different_steps(tiny_en: Path) -> None:
    import torch

    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=30)
    torch.manual_seed(0)
    with torch.no_grad():
        # The random decoder made to listen to its encoder states, and to stop where it would say a token
        # it often says: its rows then end at different steps, and leave the batch one by one.
        for layer in recognizer.model.model.decoder.layers:
            layer.encoder_attn.out_proj.weight *= 5
        encoded = torch.randn(6, 1500, 32) * 3
        prefix = recognizer._prefix([], None)
        spoken = [t for row in recognizer._decode(encoded, prefix) for t in row[3:]]
        weights = recognizer.model.proj_out.weight
        weights[EOS] = weights[max(set(spoken), key=spoken.count)] * 1.02
        alone = [recognizer._decode(encoded[i : i + 1], prefix)[0] for i in range(6)]
        assert len({len(row) for row in alone}) > 1 and len({tuple(row) for row in alone}) > 1
        assert recognizer._decode(encoded, prefix) == alone


@pytest.mark.parametrize("model", ["tiny_en", "tiny_multi"])
def test_transcribe_batch_gives_each_job_its_transcript_alone(model: str, request: pytest.FixtureRequest) -> None:
    recognizer = TorchWhisperRecognizer(request.getfixturevalue(model), device="cpu", max_new_tokens=12)
    prompts = [None, "kitchen lights", None, None, "kitchen lights"]
    languages = [None] * 5 if not recognizer.multilingual else [None, "fr", "de", None, "en"]
    jobs = [recognizer.prepare(c, language=lang, prompt=p) for c, lang, p in zip(clips(), languages, prompts)]
    batched = recognizer.transcribe_batch(jobs)
    alone = [recognizer.transcribe(c, language=lang, prompt=p) for c, lang, p in zip(clips(), languages, prompts)]
    assert batched == alone
    assert batched[3].usage.output_tokens > 12  # two windows
    assert batched[4].text == "" and batched[4].usage.output_tokens == 0
    assert batched[1].usage.prompt_tokens > 0


def test_the_batcher_runs_concurrent_callers_in_one_batch(tiny_en: Path) -> None:
    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=12)
    audio = clips()[:3] + [clips()[0][::2]]
    # a window far longer than the test: the batch closes because max_batch callers are waiting
    batcher = BatchedRecognizer(recognizer, max_batch=4, window_s=60)
    results: list = [None] * 4
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, batcher.transcribe(float_to_pcm16(audio[i]))))
        for i in range(4)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert list(batcher.batch_sizes) == [4]
    assert 0 < batcher.busy_s <= time.monotonic() - started  # the one batch's time, for benchmarks
    assert list(batcher.batch_seconds) == [batcher.busy_s]
    # each request waited for the other three, then for the batch: its job time is its wait plus the batch
    assert len(batcher.wait_seconds) == len(batcher.job_seconds) == 4
    for wait, job in zip(batcher.wait_seconds, batcher.job_seconds):
        assert job == pytest.approx(wait + batcher.busy_s, abs=0.05) and wait >= 0
    assert results == [recognizer.transcribe(float_to_pcm16(c)) for c in audio]
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(audio[0])


def test_a_bad_request_fails_alone_and_a_failed_batch_fails_its_callers(
    tiny_en: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=4)
    batcher = BatchedRecognizer(recognizer, window_s=0)
    with pytest.raises(ValueError, match="English-only; got language 'fr'"):
        batcher.submit(clips()[0], language="fr")
    with pytest.raises(ValueError, match="lasts 601.0 s"):
        batcher.submit(np.zeros(601 * 16000, np.float32))
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        BatchedRecognizer(recognizer, max_batch=0)
    monkeypatch.setattr(recognizer, "transcribe_batch", lambda jobs: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        batcher.transcribe(clips()[0])
    monkeypatch.undo()
    assert batcher.transcribe(clips()[0]).usage.output_tokens > 0  # the worker serves on
    batcher.close()


def test_the_pipeline_hands_concurrent_turns_to_the_batcher(tiny_en: Path) -> None:
    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=6)
    batcher = BatchedRecognizer(recognizer, max_batch=3, window_s=60)
    pipeline = OmniPipeline(
        OmniConfig(), engine=FakeEngine([]), model_name="fake", max_context_tokens=4096, asr=batcher
    )
    pcm = [float_to_pcm16(c) for c in clips()[:3]]

    async def three() -> list:
        return await asyncio.gather(*(pipeline.transcribe(p, 16000) for p in pcm))

    results = asyncio.run(three())
    assert list(batcher.batch_sizes) == [3]
    assert [r.text for r in results] == [recognizer.transcribe(p).text for p in pcm]
    batcher.close()


def test_the_worker_prepares_the_recognizer_in_its_own_thread_before_the_constructor_returns(
    tiny_en: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # cuDNN's plans are kept per thread, and the loader's next stage must not use the device meanwhile
    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=4)
    prepared: list[tuple[str, int]] = []

    def prepare_batches(max_batch: int) -> None:
        time.sleep(0.2)
        prepared.append((threading.current_thread().name, max_batch))

    monkeypatch.setattr(recognizer, "prepare_batches", prepare_batches)
    batcher = BatchedRecognizer(recognizer, max_batch=3, window_s=0)
    assert prepared == [("asr-batcher", 3)]
    batcher.close()
    monkeypatch.setattr(recognizer, "prepare_batches", lambda max_batch: 1 / 0)
    batcher = BatchedRecognizer(recognizer, window_s=0)
    assert "preparing the recognizer for batches failed" in caplog.text
    assert batcher.transcribe(clips()[0]).usage.output_tokens > 0  # it serves anyway
    batcher.close()


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_the_torch_recognizer_prepares_every_batch_size_once_on_a_gpu(tiny_en: Path, graphs: bool) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    recognizer = TorchWhisperRecognizer(tiny_en, device="cuda", max_new_tokens=4, encoder_graphs=graphs)
    assert recognizer._encoder.graphs == graphs
    spectrograms: list[int] = []
    encoded: list[int] = []
    log_mel, encode = recognizer._features, recognizer._encode
    recognizer._features = lambda samples: spectrograms.append(len(samples)) or log_mel(samples)  # type: ignore[method-assign]
    recognizer._encode = lambda f: encoded.append(f.shape[0]) or encode(f)  # type: ignore[method-assign]
    recognizer.prepare_batches(5)
    # each size's spectrogram once (cuFFT's plans); the encoder too unless its graphs were captured already
    assert spectrograms == [1, 2, 3, 4, 5] and encoded == ([] if graphs else [1, 2, 3, 4, 5])
    cpu = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=4)
    features = cpu._features([clips()[0]])
    on_gpu = log_mel([clips()[0]])
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.float().cpu(), features.float(), atol=2e-3, rtol=0)


@pytest.mark.gpu
def test_a_gpu_batch_neither_waits_for_nor_stalls_the_default_stream(tiny_en: Path) -> None:
    """In the server the engines step on the default stream: a batch runs on the recognizer's own stream,
    returning while work queued there before it still runs, with the transcripts it gives alone."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    recognizer = TorchWhisperRecognizer(tiny_en, device="cuda", max_new_tokens=8)
    jobs = [recognizer.prepare(clip) for clip in clips()[:3]]
    alone = recognizer.transcribe_batch(jobs)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(400):  # about a second of products queued on the default stream
        x = (x @ x) * 1e-3
    busy = torch.cuda.Event()
    busy.record()
    beside = recognizer.transcribe_batch(jobs)
    assert not busy.query(), "the batch waited for the default stream's work"
    torch.cuda.synchronize()
    assert beside == alone
