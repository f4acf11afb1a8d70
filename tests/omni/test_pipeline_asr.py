"""The pipeline's transcriptions through a recognizer that runs one call at a time, directly or through the
ASR batcher."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from omni_gateway.encoders.asr import AsrJob, AsrResult, AsrUsage
from omni_gateway.encoders.asr_batch import BatchedRecognizer
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline

from tests.omni.test_pipeline import FakeEngine


class GatedRecognizer:
    """Each call waits for ``gate``; records the audio it transcribed."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.heard: list[bytes] = []

    def transcribe(self, audio: bytes, *, sample_rate: int = 16000, language=None, prompt=None) -> AsrResult:  # type: ignore[no-untyped-def]
        self.started.set()
        self.gate.wait(10)
        self.heard.append(audio)
        return AsrResult("hi", "en", 0.1, AsrUsage(0.1, 0, 1))


class GatedBatchRecognizer(GatedRecognizer):
    """The same, read through ``prepare`` and ``transcribe_batch``, as the ASR batcher calls it."""

    multilingual = False

    def prepare(self, audio: bytes, *, sample_rate: int = 16000, language=None, prompt=None) -> AsrJob:  # type: ignore[no-untyped-def]
        return AsrJob(np.frombuffer(audio, np.int16).astype(np.float32), language, ())

    def transcribe_batch(self, jobs: list[AsrJob]) -> list[AsrResult]:
        return [self.transcribe(job.samples.astype(np.int16).tobytes()) for job in jobs]

    def prepare_batches(self, max_batch: int) -> None:
        pass


@pytest.mark.parametrize("batched", [False, True], ids=["lock", "batcher"])
def test_a_transcription_dropped_while_it_waits_for_the_recognizer_never_runs(batched: bool) -> None:
    recognizer = GatedBatchRecognizer() if batched else GatedRecognizer()
    asr = BatchedRecognizer(recognizer, max_batch=1) if batched else recognizer
    pipeline = OmniPipeline(OmniConfig(), engine=FakeEngine([]), model_name="fake", max_context_tokens=64, asr=asr)

    async def go() -> str:
        first = asyncio.create_task(pipeline.transcribe(b"\x01\x00" * 160, 16000))
        await asyncio.to_thread(recognizer.started.wait, 10)
        dropped = asyncio.create_task(pipeline.transcribe(b"\x02\x00" * 160, 16000))
        await asyncio.sleep(0.05)  # it is now waiting for the recognizer
        dropped.cancel()
        await asyncio.gather(dropped, return_exceptions=True)  # its caller has left
        recognizer.gate.set()
        third = await pipeline.transcribe(b"\x03\x00" * 160, 16000)
        return (await first).text + third.text

    assert asyncio.run(go()) == "hihi"
    assert [a[:1] for a in recognizer.heard] == [b"\x01", b"\x03"]
    if isinstance(asr, BatchedRecognizer):
        asr.close()


def test_a_transcription_dropped_while_its_audio_is_converted_never_runs() -> None:
    class SlowPrepare(GatedBatchRecognizer):
        def __init__(self) -> None:
            super().__init__()
            self.preparing = threading.Event()
            self.prepared = threading.Event()

        def prepare(self, audio: bytes, **kwargs) -> AsrJob:  # type: ignore[no-untyped-def]
            self.preparing.set()
            self.prepared.wait(10)
            return super().prepare(audio, **kwargs)

    recognizer = SlowPrepare()
    recognizer.gate.set()
    batcher = BatchedRecognizer(recognizer, max_batch=1)
    pipeline = OmniPipeline(OmniConfig(), engine=FakeEngine([]), model_name="fake", max_context_tokens=64, asr=batcher)

    async def go() -> str:
        dropped = asyncio.create_task(pipeline.transcribe(b"\x02\x00" * 160, 16000))
        await asyncio.to_thread(recognizer.preparing.wait, 10)  # converting, off the event loop
        dropped.cancel()
        await asyncio.gather(dropped, return_exceptions=True)
        recognizer.prepared.set()
        return (await pipeline.transcribe(b"\x03\x00" * 160, 16000)).text

    assert asyncio.run(go()) == "hi"
    assert [a[:1] for a in recognizer.heard] == [b"\x03"]
    batcher.close()


def test_shutdown_stops_the_recognizer_and_voice_batch_workers() -> None:
    from omni_gateway.omni.heads.tts.batch import BatchedSynthesizer
    from omni_gateway.omni.heads.tts.head import TtsHead

    from tests.omni.test_tts import SlowTone

    recognizer = GatedBatchRecognizer()
    recognizer.gate.set()
    asr = BatchedRecognizer(recognizer, max_batch=4)
    tts = TtsHead(BatchedSynthesizer(SlowTone(seconds=0.01), window_s=0))
    engine = FakeEngine([])
    engine.shutdown = lambda: None  # type: ignore[method-assign]
    pipeline = OmniPipeline(OmniConfig(), engine=engine, model_name="fake", max_context_tokens=64, asr=asr, tts=tts)
    assert asr._worker.is_alive() and tts.synthesizer._worker.is_alive()  # type: ignore[attr-defined]
    pipeline.shutdown()
    assert not asr._worker.is_alive() and not tts.synthesizer._worker.is_alive()  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="closed"):
        asr.submit(b"\x01\x00" * 160)


@pytest.mark.parametrize(("alone", "hears"), [(True, False), (False, False), (True, True)])
def test_the_loader_makes_each_asr_batch_hold_the_engine_steps_back(
    alone: bool, hears: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``asr_batches_alone`` the engines of the process wait while a batch runs and step once it
    returns; without it they never wait, nor when the LLM hears the audio itself (the transcript is then a
    side output)."""
    import omni_gateway.encoders.asr as asr_module
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.engine.runner.step_gate import wait_for_urgent
    from omni_gateway.omni.loading import _load_voice

    recognizer = GatedBatchRecognizer()
    monkeypatch.setattr(
        asr_module, "load_recognizer", lambda spec, *, device, hold: BatchedRecognizer(recognizer, hold=hold)
    )
    config = OmniConfig(engine=EngineConfig(device="cpu"), tts=None, asr="asr-dir", asr_batches_alone=alone)
    asr, _ = _load_voice(config, 1, None, hears=hears)
    future = asr.submit(b"\x01\x00" * 160)
    assert recognizer.started.wait(10)
    held = alone and not hears
    assert wait_for_urgent(timeout_s=0.05) is not held  # the batch runs
    recognizer.gate.set()
    assert future.result(10).text == "hi"
    assert wait_for_urgent(timeout_s=0.05)  # returned: nothing holds the engines
    asr.close()
