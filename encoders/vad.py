"""Streaming voice activity detection with the packaged silero-vad ONNX model.

The model runs on 512-sample windows of 16 kHz audio, each prefixed with the last 64 samples of the
previous window, and carries a recurrent state between windows. One ONNX session is shared by every
detector (onnxruntime sessions are thread-safe); each detector keeps its own state, context and clock.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
from omni_gateway.encoders.audio import StreamResampler, pcm16_to_float

MODEL_RATE = 16000
WINDOW = 512
CONTEXT = 64
WINDOW_MS = WINDOW * 1000 / MODEL_RATE
# Leaving speech takes a probability this far below the threshold (silero's hysteresis), so a
# probability hovering at the threshold does not flap between speech and silence.
HYSTERESIS = 0.15


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
        self._session = session if session is not None else load_session()
        self._resampler = StreamResampler(input_rate, MODEL_RATE)
        self._neg_threshold = max(threshold - HYSTERESIS, 0.01)
        self.reset()

    def reset(self) -> None:
        self._resampler.reset()
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._odd_byte = b""
        self._windows = 0
        self._speaking = False
        self._silence_since_ms: float | None = None
        self.last_probability = 0.0

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
        events: list[SpeechEvent] = []
        usable = len(self._pending) - len(self._pending) % WINDOW
        for start in range(0, usable, WINDOW):
            events += self._step(self._pending[start : start + WINDOW])
        self._pending = self._pending[usable:].copy()
        return events

    def _probability(self, window: np.ndarray) -> float:
        x = np.concatenate([self._context, window])[None, :]
        prob, self._state = self._session.run(
            None, {"input": x, "state": self._state, "sr": np.array(MODEL_RATE, dtype=np.int64)}
        )
        self._context = window[-CONTEXT:].copy()
        return float(prob[0, 0])

    def _step(self, window: np.ndarray) -> list[SpeechEvent]:
        prob = self._probability(window)
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
