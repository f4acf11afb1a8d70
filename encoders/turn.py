"""Semantic end-of-turn detection (``semantic_vad``) with the Smart Turn v3 model that ships in ``pipecat-ai``.

Silero VAD finds the pauses; once a pause has lasted 200 ms the turn so far (its last 8 s at 16 kHz,
zero-padded at the front, Whisper log-mel features normalized over the whole window, as pipecat's own analyzer
feeds it) is scored by Smart Turn. A turn that sounds finished ends when the pause reaches the detector's
``silence_duration_ms``; one that sounds unfinished keeps waiting, up to ``max_silence_ms`` of silence, for the
speaker to go on.

Scoring runs on a small shared thread pool so the event loop that feeds the detector never waits on it while
audio arrives at real-time pace. A client that sends audio faster than that (a file, a test) makes ``feed``
wait for the verdict once it is ``MAX_LAG_MS`` ahead of the clock, so its outcome never depends on thread
timing.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from omni_gateway.encoders.audio import pcm16_to_float, resample
from omni_gateway.encoders.vad import SileroVad, SpeechEvent

log = logging.getLogger(__name__)

MODEL_RATE = 16000
WINDOW_S = 8  # the model reads the last 8 s of the turn
COMPLETE = 0.5  # the model's probability of a finished turn at and above which the turn ends
# The silence after the speech that the model hears, as pipecat's analyzer (after its VAD's 0.2 s stop) feeds
# it: with more, it hears unfinished phrases as finished ("... for two people and": 0.03 at 0.2 s, 0.55 at 0.3 s).
SCORED_SILENCE_MS = 200
MAX_LAG_MS = 1000  # how far ahead of real time a client's audio may run before ``feed`` waits for a verdict
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
PACKAGE = "pipecat-ai==1.14.0"


def default_model_path() -> Path:
    """The Smart Turn v3 weights inside the installed ``pipecat`` package (its ``__init__`` is never run)."""
    spec = importlib.util.find_spec("pipecat")
    hint = f"semantic_vad needs the Smart Turn v3 model of the pipecat-ai package: pip install --no-deps {PACKAGE}"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package pipecat-ai is not installed; {hint}")
    path = Path(spec.submodule_search_locations[0]) / "audio" / "turn" / "smart_turn" / "data" / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed pipecat package; {hint}")
    return path


class SmartTurn:
    """The loaded model; ``probability`` is thread-safe (onnxruntime sessions are)."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime as ort
        from transformers import WhisperFeatureExtractor

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(path or default_model_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._features = WhisperFeatureExtractor(chunk_length=WINDOW_S, sampling_rate=MODEL_RATE)

    def features(self, samples: np.ndarray) -> np.ndarray:
        """(1, 80, 800) log-mel features of 16 kHz mono float audio: its last 8 s, zero-padded in front."""
        n = WINDOW_S * MODEL_RATE
        x = np.asarray(samples, dtype=np.float32)[-n:]
        x = np.pad(x, (n - len(x), 0))
        out = self._features(x, sampling_rate=MODEL_RATE, return_tensors="np", do_normalize=True)
        return np.asarray(out["input_features"], dtype=np.float32)

    def probability(self, samples: np.ndarray) -> float:
        """How likely the speech in ``samples`` (16 kHz mono float) is a finished turn."""
        (logits,) = self._session.run(None, {"input_features": self.features(samples)})
        return float(logits[0, 0])  # the exported graph ends in a sigmoid


@functools.lru_cache(maxsize=2)
def load_smart_turn(path: str | None = None) -> SmartTurn:
    return SmartTurn(Path(path) if path else None)


@functools.lru_cache(maxsize=1)
def scoring_pool() -> ThreadPoolExecutor:
    """Shared by every session: scores are short and rare (one per pause), two threads keep up."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="smart-turn")


class SemanticTurn:
    """Streaming turn detector over ``vad`` (whose ``silence_duration_ms`` is the pause that gets scored).

    Emits the same events as ``SileroVad``: ``speech_paused`` at the start of a pause, then either
    ``speech_resumed`` (the speaker went on) or ``speech_stopped`` (at pause + ``vad.silence_duration_ms``
    for a turn that sounds finished, at pause + ``max_silence_ms`` at the latest otherwise).
    """

    def __init__(
        self,
        vad: SileroVad,
        *,
        max_silence_ms: int,
        input_rate: int = 24000,
        score: Callable[[np.ndarray], float] | None = None,
        executor: Executor | None = None,
    ) -> None:
        if max_silence_ms < vad.silence_duration_ms:
            raise ValueError(
                f"max_silence_ms ({max_silence_ms}) must be at least the scored pause ({vad.silence_duration_ms})"
            )
        self._vad = vad
        self.max_silence_ms = max_silence_ms
        self._rate = input_rate
        self._score = score if score is not None else lambda x: load_smart_turn().probability(x)
        self._executor = executor if executor is not None else scoring_pool()
        self._keep_bytes = (WINDOW_S + 2) * input_rate * 2
        self.last_probability: float | None = None
        self._pending: Future[float] | None = None
        self.reset()

    def listen(self, notify: Callable[[], None]) -> None:
        """Events come from ``feed`` only: the detector under it judges inline (it reads its clock)."""

    def reset(self) -> None:
        self._vad.reset()
        self._pcm = bytearray()
        self._pcm_start_ms = 0.0  # stream time of self._pcm[0]
        self._turn_start_ms = 0
        self._pause_ms: int | None = None  # where the current pause began (None: speaking or idle)
        self._scored = False  # the current pause has been sent to the model
        self._stop_ms = 0
        self._stop_wall = 0.0  # time.monotonic() at the stop
        self._waiting = False  # silero ended its turn; this one is still open
        self._cancel()

    def _cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._pending = None

    def feed(self, pcm16: bytes) -> list[SpeechEvent]:
        self._pcm += pcm16
        excess = len(self._pcm) - self._keep_bytes
        if excess > 0:
            excess -= excess % 2
            del self._pcm[:excess]
            self._pcm_start_ms += excess * 1000 / (2 * self._rate)
        events: list[SpeechEvent] = []
        for event in self._vad.feed(pcm16):
            if event.kind == "speech_started":
                if self._waiting:  # the speaker went on within the wait: the same turn
                    self._waiting = False
                    self._pause_ms = None
                    self._cancel()
                    events.append(SpeechEvent("speech_resumed", event.audio_ms))
                else:
                    self._turn_start_ms = event.audio_ms
                    events.append(event)
            elif event.kind == "speech_paused":
                self._pause_ms, self._scored = event.audio_ms, False
                events.append(event)
            elif event.kind == "speech_resumed":
                self._pause_ms = None
                self._cancel()
                events.append(event)
            else:  # silero's stop: the pause has lasted the short wait; the verdict decides
                self._waiting = True
                self._stop_ms, self._stop_wall = event.audio_ms, time.monotonic()
                self._submit()
        self._submit_when_due()
        if self._waiting:
            events += self._decide()
        return events

    def _scored_until(self) -> int:
        assert self._pause_ms is not None
        return self._pause_ms + min(SCORED_SILENCE_MS, self._vad.silence_duration_ms)

    def _submit_when_due(self) -> None:
        """Score a pause once it has lasted ``SCORED_SILENCE_MS``: the verdict is ready by the short stop."""
        if self._pause_ms is not None and self._vad.audio_ms >= self._scored_until():
            self._submit()

    def _submit(self) -> None:
        if not self._scored and self._pause_ms is not None:
            self._scored = True
            audio = self._turn_audio(self._scored_until())
            self._pending = self._executor.submit(self._score_safely, audio)

    def _decide(self) -> list[SpeechEvent]:
        now_ms = self._vad.audio_ms
        assert self._pause_ms is not None
        deadline = self._pause_ms + self.max_silence_ms
        if self._pending is not None:
            if not self._pending.done():
                # audio fed since the stop beyond the time that passed: a client ahead of real time
                ahead_ms = now_ms - self._stop_ms - (time.monotonic() - self._stop_wall) * 1000
                if ahead_ms < MAX_LAG_MS:
                    if now_ms < deadline:
                        return []
                    self._cancel()  # a real-time client waited the whole cap: the verdict comes too late
                    return self._end(deadline)
            self.last_probability = self._pending.result()
            self._pending = None
            if self.last_probability >= COMPLETE:
                return self._end(self._stop_ms)
        return self._end(deadline) if now_ms >= deadline else []

    def _end(self, at_ms: int) -> list[SpeechEvent]:
        self._waiting = False
        self._pause_ms = None
        return [SpeechEvent("speech_stopped", at_ms)]

    def _turn_audio(self, end_ms: int) -> np.ndarray:
        """The turn from its start to ``end_ms`` (at most the model's window), resampled to 16 kHz."""
        start_ms = max(self._turn_start_ms, end_ms - WINDOW_S * 1000)
        lo = max(0, int((start_ms - self._pcm_start_ms) * self._rate / 1000) * 2)
        hi = max(lo, int((end_ms - self._pcm_start_ms) * self._rate / 1000) * 2)
        return resample(pcm16_to_float(bytes(self._pcm[lo:hi])), self._rate, MODEL_RATE)

    def _score_safely(self, samples: np.ndarray) -> float:
        """A failed score ends the turn at the short pause, as plain server VAD would."""
        try:
            return float(self._score(samples))
        except Exception:
            log.exception("end-of-turn scoring failed; ending the turn at the pause")
            return 1.0
