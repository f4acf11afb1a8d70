"""Streaming voice activity detection with the packaged silero-vad ONNX model.

The model runs on 512-sample windows of 16 kHz audio, each prefixed with the last 64 samples of the
previous window, and carries a recurrent state between windows. One ONNX session is shared by every
detector (onnxruntime sessions are thread-safe); each detector keeps its own state, context and clock.

A server with many sessions gives its detectors a ``VadBatcher``: one worker thread judges the next window
of every detector with audio waiting in one ONNX call (the model takes a batch with a state per row), off
the event loop (onnxruntime releases the GIL while it runs). One call costs about 0.3 ms for one window and
3 ms for 32 on one core, so batching cuts the model's CPU time about threefold once batches hold a few
windows; a session's events then come a batch later (10 ms plus the call), through the detector's ``listen``
callback, and are the same events as one by one.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
from omni_gateway.encoders.audio import StreamResampler, pcm16_to_float
from omni_gateway.encoders.batch_window import wait_for_batch

MODEL_RATE = 16000
WINDOW = 512
CONTEXT = 64
WINDOW_MS = WINDOW * 1000 / MODEL_RATE
# Leaving speech takes a probability this far below the threshold (silero's hysteresis), so a
# probability hovering at the threshold does not flap between speech and silence.
HYSTERESIS = 0.15
_SR = np.array(MODEL_RATE, dtype=np.int64)

log = logging.getLogger(__name__)


class SpeechEvent(NamedTuple):
    kind: Literal["speech_started", "speech_paused", "speech_resumed", "speech_stopped"]
    audio_ms: int  # ms since the start of the audio fed to this detector


def default_model_path() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package silero-vad is not installed; it ships the VAD weights (silero_vad.onnx)")
    return Path(spec.submodule_search_locations[0]) / "data" / "silero_vad.onnx"


@functools.lru_cache(maxsize=4)
def load_session(path: str | None = None):
    """The shared inference session; one thread per call keeps many sessions from oversubscribing cores."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(path or default_model_path()), sess_options=options, providers=["CPUExecutionProvider"]
    )


class SileroVad:
    """Streaming silero-vad detector; fed mono pcm16 at ``input_rate``.

    ``speech_started.audio_ms`` is the start of the first speech window minus ``prefix_padding_ms``
    (floored at 0), so audio from there on holds the whole utterance. ``speech_stopped.audio_ms`` is the
    point where ``silence_duration_ms`` of silence has elapsed, the end of the audio that belongs to the
    turn, as the OpenAI Realtime API reports ``audio_end_ms``.

    Between the two, ``speech_paused`` marks the first silent window of a pause (its ``audio_ms`` is where
    that window starts, the end of the speech so far) and ``speech_resumed`` the window where speech came
    back before ``silence_duration_ms`` ran out. A ``speech_stopped`` always follows the ``speech_paused``
    of its own pause, so a listener can start work on the audio up to the pause while the detector is
    still waiting out the silence.
    """

    def __init__(
        self,
        *,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        input_rate: int = 24000,
        session=None,
        batcher: VadBatcher | None = None,
    ) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"VAD threshold must lie in (0, 1); got {threshold}")
        if prefix_padding_ms < 0 or silence_duration_ms < 0:
            raise ValueError(
                "VAD prefix_padding_ms and silence_duration_ms must be >= 0; got "
                f"{prefix_padding_ms} and {silence_duration_ms}"
            )
        self.threshold = threshold
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self._batcher = batcher
        if batcher is None:
            self._session = session if session is not None else load_session()
        self._resampler = StreamResampler(input_rate, MODEL_RATE)
        self._neg_threshold = max(threshold - HYSTERESIS, 0.01)
        # With a batcher, the worker judges windows and steps the detector: this lock guards what both touch.
        self._lock = threading.Lock()
        self._queued: deque[np.ndarray] = deque()  # windows waiting for the batcher
        self._in_flight = False  # one of them is in the batch being run
        self._generation = 0  # bumped by reset: a window judged before it is dropped
        self._ready: list[SpeechEvent] = []  # events the batcher produced that feed has not returned yet
        self._notify: Callable[[], None] | None = None
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._resampler.reset()
            self._state = np.zeros((2, 1, 128), dtype=np.float32)
            self._context = np.zeros(CONTEXT, dtype=np.float32)
            self._pending = np.zeros(0, dtype=np.float32)
            self._odd_byte = b""
            self._windows = 0
            self._speaking = False
            self._silence_since_ms: float | None = None
            self.last_probability = 0.0
            self._queued.clear()
            self._ready.clear()
            self._generation += 1

    def end_turn(self) -> None:
        """End the turn being spoken (a detector above decided it is over): the silence after it brings no
        stop, and the next speech starts a new turn."""
        with self._lock:
            self._speaking = False
            self._silence_since_ms = None

    @property
    def judging(self) -> bool:
        """Whether windows fed so far still wait for the batcher's verdict."""
        with self._lock:
            return bool(self._queued) or self._in_flight

    def listen(self, notify: Callable[[], None]) -> None:
        """With a batcher, ``notify`` is called (from the batcher's thread) when events are ready that no
        ``feed`` returned yet; ``feed(b"")`` then returns them. Without one, every event comes from ``feed``."""
        self._notify = notify

    @property
    def audio_ms(self) -> float:
        """How much audio the detector has judged so far, in ms (the end of its last window)."""
        return self._windows * WINDOW_MS

    def feed(self, pcm16: bytes) -> list[SpeechEvent]:
        data = self._odd_byte + pcm16
        cut = len(data) - len(data) % 2
        self._odd_byte = data[cut:]
        resampled = self._resampler.process(pcm16_to_float(data[:cut]))
        self._pending = np.concatenate([self._pending, resampled]) if len(self._pending) else resampled
        usable = len(self._pending) - len(self._pending) % WINDOW
        windows = [self._pending[start : start + WINDOW] for start in range(0, usable, WINDOW)]
        self._pending = self._pending[usable:].copy()
        if self._batcher is None:
            events: list[SpeechEvent] = []
            for window in windows:
                events += self._step(self._probability(window))
            return events
        with self._lock:
            self._queued.extend(windows)
            submit = bool(self._queued) and not self._in_flight
            events, self._ready = self._ready, []
        if submit:
            self._batcher.submit(self)
        return events

    def _probability(self, window: np.ndarray) -> float:
        x = np.concatenate([self._context, window])[None, :]
        prob, self._state = self._session.run(None, {"input": x, "state": self._state, "sr": _SR})
        self._context = window[-CONTEXT:].copy()
        return float(prob[0, 0])

    # ---- the batcher's side (its worker thread) -----------------------------------------------------
    def _take_window(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """The next window's model input (context + window) and state, or None if nothing waits."""
        with self._lock:
            if not self._queued or self._in_flight:
                return None
            self._in_flight = True
            window = self._queued.popleft()
            x = np.concatenate([self._context, window])
            self._context = window[-CONTEXT:].copy()
            return self._generation, x, self._state[:, 0]

    def _judged(self, generation: int, prob: float, state: np.ndarray) -> tuple[bool, bool]:
        """Step with the batcher's verdict; returns (events became ready, more windows wait)."""
        with self._lock:
            self._in_flight = False
            if generation != self._generation:  # reset while the window was judged: it belonged to the old stream
                return False, bool(self._queued)
            self._state = state[:, None].copy()
            events = self._step(prob)
            self._ready += events
            return bool(events), bool(self._queued)

    def _step(self, prob: float) -> list[SpeechEvent]:
        self.last_probability = prob
        start_ms = self._windows * WINDOW_MS
        self._windows += 1
        end_ms = self._windows * WINDOW_MS
        if not self._speaking:
            if prob >= self.threshold:
                self._speaking = True
                self._silence_since_ms = None
                return [SpeechEvent("speech_started", max(0, round(start_ms - self.prefix_padding_ms)))]
            return []
        events: list[SpeechEvent] = []
        if prob >= self.threshold:
            if self._silence_since_ms is not None:
                events.append(SpeechEvent("speech_resumed", round(start_ms)))
            self._silence_since_ms = None
        elif prob < self._neg_threshold and self._silence_since_ms is None:
            self._silence_since_ms = start_ms
            events.append(SpeechEvent("speech_paused", round(start_ms)))
        if self._silence_since_ms is not None and end_ms - self._silence_since_ms >= self.silence_duration_ms:
            self._speaking = False
            self._silence_since_ms = None
            events.append(SpeechEvent("speech_stopped", round(end_ms)))
        return events


class VadBatcher:
    """Judges the waiting windows of many ``SileroVad`` detectors in one ONNX call per batch, on a worker thread.

    A batch starts ``window_s`` after the first window waits (so the sessions' audio messages, which arrive
    spread over their 40 ms cadence, share it), or at once while detectors have windows left from earlier
    batches (audio sent faster than real time), and holds one window per detector (the model is recurrent:
    a detector's next window needs the state its last one left), at most ``max_batch``.
    """

    def __init__(self, session=None, *, max_batch: int = 256, window_s: float = 0.01) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1; got {max_batch}")
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0; got {window_s}")
        self._session = session if session is not None else load_session()
        self.max_batch = max_batch
        self.window_s = window_s
        self.batches = 0  # for benchmarks: how many ONNX calls, over how many windows
        self.windows = 0
        self._waiting: dict[SileroVad, None] = {}  # an ordered set: first come, first judged
        self._backlog = False  # detectors still hold windows from before the last batch: no reason to wait
        self._ready = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="vad-batcher", daemon=True)
        self._worker.start()

    def submit(self, detector: SileroVad) -> None:
        with self._ready:
            if self._closed:
                raise RuntimeError("the VAD batcher was closed")
            self._waiting[detector] = None
            self._ready.notify()

    def close(self) -> None:
        """Stop the worker once the waiting windows are judged."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._worker.join()

    def _take(self) -> list[SileroVad] | None:
        with self._ready:
            window = 0.0 if self._backlog else self.window_s
            if not wait_for_batch(
                self._ready, lambda: len(self._waiting), lambda: self._closed, self.max_batch, window
            ):
                return None
            self._backlog = False
            taken = list(self._waiting)[: self.max_batch]
            for detector in taken:
                del self._waiting[detector]
            return taken

    def _run(self) -> None:
        while (detectors := self._take()) is not None:
            rows = [(d, row) for d in detectors if (row := d._take_window()) is not None]
            if not rows:
                continue
            x = np.stack([row[1] for _, row in rows])
            state = np.stack([row[2] for _, row in rows], axis=1)
            try:
                probs, states = self._session.run(None, {"input": x, "state": state, "sr": _SR})
            except Exception:  # a failed call must not stop every session's VAD: judge the rows as silence
                log.exception("a VAD batch of %d windows failed", len(rows))
                probs, states = np.zeros((len(rows), 1), np.float32), state
            self.batches += 1
            self.windows += len(rows)
            for i, (detector, (generation, _, _)) in enumerate(rows):
                has_events, more = detector._judged(generation, float(probs[i, 0]), states[:, i])
                if more:
                    with self._ready:
                        self._waiting[detector] = None
                        self._backlog = True
                if has_events and detector._notify is not None:
                    try:
                        detector._notify()
                    except Exception:  # one listener's failure must not stop the other sessions' VAD
                        log.exception("a VAD listener failed")
