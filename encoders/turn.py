"""Semantic end-of-turn detection (``semantic_vad``): the words heard so far and the Smart Turn v3 model that
ships in ``pipecat-ai``.

Silero VAD finds the pauses. Once a pause has lasted the policy's ``scored_silence_ms`` and its transcript (when
one is under way) is in, the turn so far (its last 8 s at 16 kHz, zero-padded at the front, Whisper log-mel
features normalized over the whole window, as pipecat's own analyzer feeds it) is scored by Smart Turn. The
turn ends as soon as that verdict is in, when it sounds finished and its words do not end on a word a sentence
rarely ends with ("... a table for two people and"); otherwise it waits, up to ``max_silence_ms`` of silence, for
the speaker to go on.

The words come from whoever transcribes the pause (the realtime session starts a transcription of the turn at
every pause): ``expect_words`` says one is under way and ``hear`` hands its text over. While words are
expected the verdict waits for them, at most ``WORDS_WAIT_MS``; a turn nobody transcribes (a model that hears
audio itself) is judged by its sound alone. On the packaged Piper voice, whose unfinished phrases keep a
sentence's falling pitch, the sound alone ended 15 of 25 unfinished phrases early and the words bring that to
3 (``python -m benchmarks.turn_decisions``).

Scoring runs on a small shared thread pool so the event loop that feeds the detector never waits on it while
audio arrives at real-time pace. A client that sends audio faster than that (a file, a test) makes ``feed``
wait for the verdict once it is ``MAX_LAG_MS`` ahead of the clock, so its outcome never depends on thread
timing.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omni_gateway.encoders.audio import pcm16_to_float, resample
from omni_gateway.encoders.vad import SileroVad, SpeechEvent

log = logging.getLogger(__name__)

MODEL_RATE = 16000
WINDOW_S = 8  # the model reads the last 8 s of the turn
MAX_LAG_MS = 1000  # how far ahead of real time a client's audio may run before ``feed`` waits for a verdict
WORDS_WAIT_MS = 400  # how long past the model's verdict a turn waits for the transcript it expects


@dataclass(frozen=True, slots=True)
class TurnPolicy:
    """When a pause ends a turn: once it has lasted ``scored_silence_ms``, if the model's probability of a
    finished turn reaches ``complete`` (and the words agree); if it does not, the model hears the turn once more
    at ``rescored_silence_ms`` (a question's last syllable can sound open until a longer silence follows it);
    after ``max_silence_ms`` of silence at the latest."""

    scored_silence_ms: int
    rescored_silence_ms: int
    complete: float
    max_silence_ms: int

    def __post_init__(self) -> None:
        if not 0 < self.scored_silence_ms <= self.rescored_silence_ms <= self.max_silence_ms:
            raise ValueError(
                "expected 0 < scored_silence_ms <= rescored_silence_ms <= max_silence_ms; got "
                f"{self.scored_silence_ms}, {self.rescored_silence_ms} and {self.max_silence_ms}"
            )
        if not 0.0 < self.complete < 1.0:
            raise ValueError(f"complete must lie in (0, 1); got {self.complete}")

    @property
    def score_points_ms(self) -> tuple[int, ...]:
        """How long into a pause the model hears the turn, while it keeps sounding unfinished."""
        return tuple(sorted({self.scored_silence_ms, self.rescored_silence_ms}))


# OpenAI's eagerness: high answers soonest, low lets the user take their time; the caps are OpenAI's (8 / 4 / 2 s),
# auto is medium. Silero declares a pause one window (32 ms) into it, 70 to 120 ms after the last voiced
# sample, and the pause's transcript takes about 75 ms of Whisper from there; the verdict asked for once both
# are in ended the 20 finished questions of the Piper voice 186 ms (p50) after the speech, against about 250 ms
# with a first hearing at 100 ms of silence, and any first hearing up to 300 ms ended as many unfinished phrases
# early (7 of 25; ``benchmarks.turn_decisions``). A second hearing at 200 ms takes the few questions whose last
# syllable first sounds open. High also takes a less certain verdict.
EAGERNESS: dict[str, TurnPolicy] = {
    "low": TurnPolicy(scored_silence_ms=300, rescored_silence_ms=800, complete=0.7, max_silence_ms=8000),
    "medium": TurnPolicy(scored_silence_ms=32, rescored_silence_ms=200, complete=0.5, max_silence_ms=4000),
    "auto": TurnPolicy(scored_silence_ms=32, rescored_silence_ms=200, complete=0.5, max_silence_ms=4000),
    "high": TurnPolicy(scored_silence_ms=32, rescored_silence_ms=200, complete=0.4, max_silence_ms=2000),
}

# Words an English sentence rarely ends with: articles, conjunctions, most prepositions, possessives, the copula
# and a trailing "I". Left out are those that often end one in speech ("turn it on", "where are you from",
# "yes I can", "I'd like", "I know her").
UNFINISHED_LAST_WORDS = frozenset(
    "a an the and or but because to for of at by with into between my your our their its is are was were i".split()
)


def sounds_unfinished(words: str) -> bool:
    """Whether a transcript stops on a word that leaves its sentence open ("... for two people and")."""
    tail = re.findall(r"[a-z']+", words.lower())
    return bool(tail) and tail[-1] in UNFINISHED_LAST_WORDS


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


_LOADING = threading.Lock()


@functools.lru_cache(maxsize=2)
def _load(path: str | None) -> SmartTurn:
    return SmartTurn(Path(path) if path else None)


def load_smart_turn(path: str | None = None) -> SmartTurn:
    """The loaded model, once per process: the first pause's scoring and the warm-up may ask at the same time
    (two threads importing transformers' lazy modules at once fail)."""
    with _LOADING:
        return _load(path)


@functools.lru_cache(maxsize=1)
def scoring_pool() -> ThreadPoolExecutor:
    """Shared by every session. A score is about 45 ms of one core (the model; the features take 2), and sessions
    that pause together score together: half the cores (two at least) keep 64 of them within about 0.4 s on a
    16-core host, while the other half serve the event loop and the voice stages."""
    return ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2) // 2), thread_name_prefix="smart-turn")


class SemanticTurn:
    """Streaming turn detector over ``vad``, whose ``silence_duration_ms`` is the policy's cap.

    Emits the same events as ``SileroVad``: ``speech_paused`` at the start of a pause, then either
    ``speech_resumed`` (the speaker went on) or ``speech_stopped``: as soon as the verdict says finished, at
    pause + ``max_silence_ms`` otherwise. An early stop ends silero's turn too, so its own stop never follows.
    """

    def __init__(
        self,
        vad: SileroVad,
        policy: TurnPolicy,
        *,
        input_rate: int = 24000,
        score: Callable[[np.ndarray], float] | None = None,
        executor: Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if vad.silence_duration_ms != policy.max_silence_ms:
            raise ValueError(
                f"the VAD's silence_duration_ms ({vad.silence_duration_ms}) must be the policy's max_silence_ms "
                f"({policy.max_silence_ms}): its stop is the turn's cap"
            )
        self._vad = vad
        self.policy = policy
        self._rate = input_rate
        self._score = score if score is not None else lambda x: load_smart_turn().probability(x)
        self._executor = executor if executor is not None else scoring_pool()
        self._clock = clock  # seconds, monotonic: the pace audio would come at from a live speaker
        self._keep_bytes = (WINDOW_S + 2) * input_rate * 2
        self.last_probability: float | None = None
        self._pending: Future[tuple[float, float]] | None = None
        self._notify: Callable[[], None] | None = None
        self.reset()

    def listen(self, notify: Callable[[], None]) -> None:
        """``notify`` is called (from any thread) when ``feed(b"")`` has something new to judge: windows silero's
        batcher judged, or a verdict that came in."""
        self._notify = notify
        self._vad.listen(notify)

    def reset(self) -> None:
        self._vad.reset()
        self._pcm = bytearray()
        self._pcm_start_ms = 0.0  # stream time of self._pcm[0]
        self._turn_start_ms = 0
        self._pause_ms: int | None = None  # where the current pause began (None: speaking or idle)
        self._new_pause()

    def _new_pause(self) -> None:
        self._cancel()
        self._scores = 0  # how often the current pause has been sent to the model
        self._scored_ms = 0.0  # the stream time it was scored at
        self._scored_wall = 0.0  # self._clock() when it was
        self._verdict_ms: float | None = None  # stream time the verdict would have landed at real-time pace
        self._words_expected = False
        self._words: str | None = None
        self._words_ms = 0.0  # stream time they came at

    def _cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._pending = None

    def expect_words(self) -> None:
        """A transcript of the turn up to the current pause is under way: the verdict waits for it."""
        if self._pause_ms is not None:
            self._words_expected = True

    def hear(self, words: str | None) -> None:
        """The transcript of the turn up to the current pause (None: it failed; the sound alone decides)."""
        if self._pause_ms is not None:
            self._words, self._words_expected = words, False
            self._words_ms = self._real_time_ms(self._clock())

    def _real_time_ms(self, wall: float) -> float:
        """The stream time at ``wall`` had the audio come at real-time pace since the scoring; at most the stream's
        end. A client ahead of real time (a file, a test) so gets the decisions a live speaker would."""
        now_ms = self._vad.audio_ms
        return min(now_ms, self._scored_ms + (wall - self._scored_wall) * 1000) if self._scores else now_ms

    def feed(self, pcm16: bytes) -> list[SpeechEvent]:
        self._pcm += pcm16
        excess = len(self._pcm) - self._keep_bytes
        if excess > 0:
            excess -= excess % 2
            del self._pcm[:excess]
            self._pcm_start_ms += excess * 1000 / (2 * self._rate)
        events: list[SpeechEvent] = []
        paused_now = False
        for event in self._vad.feed(pcm16):
            if event.kind == "speech_started":
                self._turn_start_ms = event.audio_ms
            elif event.kind == "speech_paused":
                self._pause_ms = event.audio_ms
                self._new_pause()
                paused_now = True
            else:  # resumed, or silero's stop at the cap
                self._pause_ms = None
                paused_now = False
                self._new_pause()
            events.append(event)
        if self._pause_ms is None:
            return events
        if paused_now:
            # The pause is judged once its listener has heard of it and said whether words will follow
            # (``expect_words``): on the poll ``notify`` asks for at once, else with the next audio.
            if self._notify is not None:
                self._notify()
            return events
        return events + self._decide()

    def _decide(self) -> list[SpeechEvent]:
        assert self._pause_ms is not None
        now_ms = self._vad.audio_ms
        points = self.policy.score_points_ms
        unfinished = self._verdict_ms is not None and (self.last_probability or 0.0) < self.policy.complete
        if self._pending is None and self._scores < len(points) and (self._scores == 0 or unfinished):
            at_ms = self._pause_ms + points[self._scores]
            if now_ms >= at_ms and not self._words_first(now_ms, at_ms):
                self._scores += 1
                heard_ms = self._words_ms if self._words is not None else 0.0
                self._scored_ms, self._scored_wall = max(at_ms, heard_ms), self._clock()
                self._pending = self._executor.submit(self._score_safely, self._turn_audio(at_ms))
                if self._notify is not None:
                    notify = self._notify
                    self._pending.add_done_callback(lambda _: notify())
        if self._pending is not None:
            if not self._pending.done() and now_ms - self._real_time_ms(self._clock()) < MAX_LAG_MS:
                return []
            self.last_probability, done_wall = self._pending.result()
            self._pending = None
            self._verdict_ms = max(self._scored_ms, self._real_time_ms(done_wall))
        if self.last_probability is None or self._verdict_ms is None or self.last_probability < self.policy.complete:
            return []  # sounds unfinished: silero's stop at the cap ends it, unless the speaker goes on
        if self._words_expected:
            if now_ms < self._verdict_ms + WORDS_WAIT_MS:
                return []
            return self._end(self._verdict_ms + WORDS_WAIT_MS)  # the words are late: the sound decides
        if self._words is not None and sounds_unfinished(self._words):
            return []
        return self._end(max(self._verdict_ms, self._words_ms if self._words is not None else 0.0))

    def _words_first(self, now_ms: float, at_ms: int) -> bool:
        """Whether the first hearing waits for the pause's transcript, under way (for ``WORDS_WAIT_MS`` at most).
        Both take the same cores, and the turn ends on both: the words, which the prepared reply needs too,
        come sooner alone (on 2 cores Whisper took 75 ms alone and 110 ms beside the model)."""
        return self._scores == 0 and self._words_expected and now_ms < at_ms + WORDS_WAIT_MS

    def _end(self, at_ms: float) -> list[SpeechEvent]:
        self._vad.end_turn()
        self._pause_ms = None
        self._new_pause()
        return [SpeechEvent("speech_stopped", round(at_ms))]

    def _turn_audio(self, end_ms: int) -> np.ndarray:
        """The turn from its start to ``end_ms`` (at most the model's window), resampled to 16 kHz."""
        start_ms = max(self._turn_start_ms, end_ms - WINDOW_S * 1000)
        lo = max(0, int((start_ms - self._pcm_start_ms) * self._rate / 1000) * 2)
        hi = max(lo, int((end_ms - self._pcm_start_ms) * self._rate / 1000) * 2)
        return resample(pcm16_to_float(bytes(self._pcm[lo:hi])), self._rate, MODEL_RATE)

    def _score_safely(self, samples: np.ndarray) -> tuple[float, float]:
        """The probability and when it was known; a failed score ends the turn at the scored pause, as plain
        server VAD would."""
        try:
            probability = float(self._score(samples))
        except Exception:
            log.exception("end-of-turn scoring failed; ending the turn at the pause")
            probability = 1.0
        return probability, self._clock()
