"""Transcriptions from many sessions batched onto one Whisper (torch or CTranslate2).

Each caller ``submit``s its audio and gets a future. One worker thread takes what has queued: a batch
starts ``window_s`` after its first request (so turns ending together share it) or at once when
``max_batch`` requests wait, and requests that arrive while a batch runs form the next one. The batch
runs the recognizer's ``transcribe_batch``: one encoder pass, then the decoder over the batch (torch: a KV
cache per row; CTranslate2: its own batched greedy search). On a CPU the batch shares each weight pass and
each decoder step among the turns that end together, instead of queueing them behind one lock.

Why not the engine's paged KV machinery: Whisper's decoder attends to its encoder output through
cross-attention, which the engine's paged kernels (written for decoder-only LLMs) do not have, and the
encoders never import the engine. A voice turn decodes a few dozen tokens over 448 positions at most, so a
dense cache per batch costs little next to the encoder, which is where a GPU's batch pays off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
from omni_gateway.encoders.asr import SAMPLE_RATE, AsrJob, AsrResult, BatchRecognizer
from omni_gateway.encoders.batch_window import wait_for_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Request:
    job: AsrJob
    future: Future[AsrResult]
    queued_at: float


class BatchedRecognizer:
    """A ``SpeechRecognizer`` whose calls, from any number of threads, run in shared batches.

    The worker first prepares the recognizer (``prepare_batches``: on a GPU, cuDNN's plans for every batch
    size, which torch keeps per thread), and the constructor returns only then, so that the loader's next
    stage does not use the device meanwhile (a CUDA graph capture there would fail).

    ``hold`` wraps each batch's reading: the loader passes ``engine.runner.step_gate.urgent`` so that the engines of
    the process launch no step while a batch runs (a turn's transcript is on its reply's critical path)."""

    def __init__(
        self,
        recognizer: BatchRecognizer,
        *,
        max_batch: int = 32,
        window_s: float = 0.005,
        hold: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1; got {max_batch}")
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0; got {window_s}")
        self.recognizer = recognizer
        self.max_batch = max_batch
        self.window_s = window_s
        self._hold = hold
        self.batch_sizes: deque[int] = deque(maxlen=1024)  # the sizes of the latest batches, for benchmarks
        self.batch_seconds: deque[float] = deque(maxlen=1024)  # and how long each took: work, not queueing
        self.busy_s = 0.0  # seconds spent reading batches, for benchmarks (is the worker the bottleneck?)
        self.wait_seconds: deque[float] = deque(maxlen=4096)  # each request's queue -> its batch's start
        self.job_seconds: deque[float] = deque(maxlen=4096)  # each request's queue -> its result
        self._queue: deque[_Request] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._prepared = threading.Event()
        self._worker = threading.Thread(target=self._run, name="asr-batcher", daemon=True)
        self._worker.start()
        self._prepared.wait()

    @property
    def multilingual(self) -> bool:
        return self.recognizer.multilingual

    def submit(
        self,
        audio: np.ndarray | bytes,
        *,
        sample_rate: int = SAMPLE_RATE,
        language: str | None = None,
        prompt: str | None = None,
    ) -> Future[AsrResult]:
        """Queue one transcription; a bad request raises here, before it joins a batch."""
        return self.enqueue(self.prepare(audio, sample_rate=sample_rate, language=language, prompt=prompt))

    def prepare(
        self,
        audio: np.ndarray | bytes,
        *,
        sample_rate: int = SAMPLE_RATE,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsrJob:
        """Check and convert one request (decode, resample): CPU work, for the caller's thread."""
        return self.recognizer.prepare(audio, sample_rate=sample_rate, language=language, prompt=prompt)

    def enqueue(self, job: AsrJob) -> Future[AsrResult]:
        """Queue a prepared transcription for the next batch."""
        future: Future[AsrResult] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the ASR batcher was closed")
            self._queue.append(_Request(job, future, time.monotonic()))
            self._ready.notify()
        return future

    def transcribe(
        self,
        audio: np.ndarray | bytes,
        *,
        sample_rate: int = SAMPLE_RATE,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsrResult:
        return self.submit(audio, sample_rate=sample_rate, language=language, prompt=prompt).result()

    def close(self) -> None:
        """Stop the worker once the queued requests are done."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._worker.join()

    def _take(self) -> list[_Request] | None:
        with self._ready:
            if not wait_for_batch(
                self._ready, lambda: len(self._queue), lambda: self._closed, self.max_batch, self.window_s
            ):
                return None
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _run(self) -> None:
        try:
            self.recognizer.prepare_batches(self.max_batch)
        except Exception:  # only first batches' speed is at stake: serve anyway
            log.exception("preparing the recognizer for batches failed")
        finally:
            self._prepared.set()
        while (batch := self._take()) is not None:
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            if not live:
                continue
            self.batch_sizes.append(len(live))
            started = time.monotonic()
            self.wait_seconds.extend(started - r.queued_at for r in live)
            try:
                with self._hold():
                    results = self.recognizer.transcribe_batch([r.job for r in live])
            except Exception as exc:  # the batch's failure is each caller's; the worker keeps serving
                log.exception("an ASR batch of %d failed", len(live))
                for r in live:
                    r.future.set_exception(exc)
                continue
            finally:
                ended = time.monotonic()
                self.batch_seconds.append(ended - started)
                self.busy_s += self.batch_seconds[-1]
            self.job_seconds.extend(ended - r.queued_at for r in live)
            for r, result in zip(live, results):
                r.future.set_result(result)
