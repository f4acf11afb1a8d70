"""Speech from many streams synthesized in shared batches, scheduled for first audio.

Every spoken response is a stream of clauses, queued as its text arrives. A worker thread forms each batch
from what waits: first clauses before anything else, in arrival order (a session's first audio matters
more than throughput); then later clauses in the order their listeners will need them, earliest first. A
stream's next clause is due when the audio already handed to its listener runs out, played at real-time pace
from its first piece, plus the estimated audio of the stream's clauses ahead of it (before any audio, from
the stream's first submit). So a listener about to run dry goes before one with seconds in hand, and a long
answer never holds up another session's audio: its clauses come due one by one as it plays. A batch shares
one speed and voice, and while it carries a first clause, a later clause joins only when it is no longer
than the longest first clause in it (a padded batch lasts as long as its longest row).

A batch takes up to ``max_batch`` clauses but at most ``max_later`` later ones. A batch of short first
clauses costs about the same for one row as for sixteen (on a GPU the VITS call is bound by the host issuing
its operators), so the first clauses of many turns that end together share one call. A batch of later
clauses, seconds of audio each, takes longer the more rows it has: it renders in steps (a window of the
vocoder each), and first clauses that arrive meanwhile render, as a batch of their own, before its next step.
So a first clause waits for one step of a long batch (or its model pass), not all of it.

A clause's audio goes out step by step (``Clause.on_audio``), as each window of the vocoder is decoded: a
listener hears the start of a long clause after the batch's first step, not after its last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from omni_gateway.encoders.batch_window import wait_for_batch

log = logging.getLogger(__name__)


class BatchRender(Protocol):
    def step(self) -> bool:
        """Render some more; True once done."""
        ...

    def take(self) -> list[tuple[np.ndarray, bool]]:
        """Each text's samples rendered since the last call, and whether its audio is complete."""
        ...


class BatchSynthesizer(Protocol):
    sample_rate: int
    voices: tuple[str, ...]

    def prepare(self) -> None:
        """Whatever the rendering thread should do before the first batch (it is called there)."""
        ...

    def start_batch(self, texts: list[str], *, speed: float = 1.0, voice: str | None = None) -> BatchRender: ...


@dataclass(slots=True, eq=False)  # a clause is itself: the queue finds and removes it by identity
class Clause:
    text: str
    speed: float
    voice: str | None
    stream: Hashable
    first: bool
    cancel: threading.Event | None = None
    on_audio: Callable[[np.ndarray], None] | None = None  # called on the worker with each piece as it renders
    future: Future[np.ndarray] = field(default_factory=Future)  # the whole audio, once complete
    submitted: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Listener:
    """What one stream's listener has been handed, and what of the stream is queued or rendering."""

    origin: float  # the stream's first submit: when its audio is due before any came
    until: float | None = None  # when the audio handed out so far ends, played at real-time pace from its first piece
    queued: int = 0
    rendering: dict[Clause, float] = field(default_factory=dict)  # clauses under way: their estimated seconds


class DeadlineQueue:
    """The scheduling rule above, as pure state (no threads; the caller passes the clock)."""

    def __init__(self, seconds_per_char: float = 0.07) -> None:
        self.seconds_per_char = seconds_per_char  # a clause's audio per character, learnt from the clauses done
        self._firsts: deque[Clause] = deque()
        self._later: dict[Hashable, deque[Clause]] = {}
        self._listeners: dict[Hashable, _Listener] = {}

    def __len__(self) -> int:
        return len(self._firsts) + sum(len(q) for q in self._later.values())

    def push(self, clause: Clause) -> None:
        listener = self._listeners.setdefault(clause.stream, _Listener(clause.submitted))
        listener.queued += 1
        if clause.first:
            self._firsts.append(clause)
        else:
            self._later.setdefault(clause.stream, deque()).append(clause)

    def take(self, max_batch: int, max_later: int | None = None) -> list[Clause]:
        """The next batch, at most ``max_later`` (default ``max_batch``) of it later clauses; empty when
        nothing waits."""
        later_left = max_batch if max_later is None else max_later
        order = [*self._firsts, *self._by_due()]
        if not order:
            return []
        lead = order[0]
        batch: list[Clause] = []
        for clause in order:
            if len(batch) == max_batch:
                break
            if (clause.speed, clause.voice) != (lead.speed, lead.voice):
                continue
            if not clause.first:
                if not later_left:
                    break  # later clauses come after every first one: nothing else can join
                if batch and batch[0].first and len(clause.text) > max(len(c.text) for c in batch if c.first):
                    continue
                later_left -= 1
            batch.append(clause)
        for clause in batch:
            self._remove(clause)
        return batch

    def heard(self, clause: Clause, at: float, seconds: float) -> None:
        """``seconds`` of ``clause``'s audio were handed to its listener at ``at``."""
        listener = self._listeners.get(clause.stream)
        if listener is not None and seconds > 0:
            listener.until = max(at if listener.until is None else listener.until, at) + seconds

    def done(self, clause: Clause, at: float, seconds: float) -> None:
        """``clause`` is complete (or dropped) with ``seconds`` of audio; forget the listeners done with."""
        listener = self._listeners.get(clause.stream)
        if listener is not None:
            listener.rendering.pop(clause, None)
        if seconds > 0 and clause.text:
            measured = seconds * clause.speed / len(clause.text)
            self.seconds_per_char += 0.1 * (measured - self.seconds_per_char)
        for stream, listener in list(self._listeners.items()):
            if not listener.queued and not listener.rendering and (listener.until or 0.0) <= at:
                del self._listeners[stream]

    def _estimate(self, clause: Clause) -> float:
        return len(clause.text) * self.seconds_per_char / clause.speed

    def _by_due(self) -> list[Clause]:
        """The later clauses, each stream's in order, by when their listener will need them."""
        ahead: dict[Hashable, float] = {}  # a stream's first clause, queued, plays before its later ones
        for clause in self._firsts:
            ahead[clause.stream] = ahead.get(clause.stream, 0.0) + self._estimate(clause)
        due: list[tuple[float, int, Clause]] = []
        for stream, queue in self._later.items():
            listener = self._listeners[stream]
            at = listener.origin if listener.until is None else listener.until
            at += sum(listener.rendering.values()) + ahead.get(stream, 0.0)
            for clause in queue:
                due.append((at, len(due), clause))
                at += self._estimate(clause)
        return [clause for _, _, clause in sorted(due)]

    def _remove(self, clause: Clause) -> None:
        listener = self._listeners[clause.stream]
        listener.queued -= 1
        listener.rendering[clause] = self._estimate(clause)
        if clause.first:
            self._firsts.remove(clause)
            return
        queue = self._later[clause.stream]
        queue.remove(clause)
        if not queue:
            del self._later[clause.stream]


class BatchedSynthesizer:
    """A ``SpeechSynthesizer`` over a ``BatchSynthesizer``: ``submit`` from any thread, one worker renders.

    The worker first prepares the model (``BatchSynthesizer.prepare``: CUDA graphs, cuDNN plans) and the
    constructor returns only then: a CUDA graph capture fails, and breaks the other thread's work, when
    another thread of the process uses the device meanwhile (a loader warming the next stage up)."""

    def __init__(
        self, synthesizer: BatchSynthesizer, *, max_batch: int = 64, max_later: int = 16, window_s: float = 0.005
    ) -> None:
        if max_batch < 1 or max_later < 1:
            raise ValueError(f"max_batch and max_later must be at least 1; got {max_batch} and {max_later}")
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0; got {window_s}")
        self.synthesizer = synthesizer
        self.sample_rate = synthesizer.sample_rate
        self.voices = synthesizer.voices
        self.max_batch = max_batch
        self.max_later = max_later
        self.window_s = window_s
        self.batch_sizes: deque[int] = deque(maxlen=1024)  # the sizes of the latest batches, for benchmarks
        self.batch_seconds: deque[float] = deque(maxlen=1024)  # and how long each took: work, not queueing
        self.busy_s = 0.0  # seconds spent rendering batches, for benchmarks (is the worker the bottleneck?)
        self.pass_seconds: deque[float] = deque(maxlen=1024)  # each batch's model pass (``start_batch``)
        self.first_clause_seconds: deque[float] = deque(maxlen=1024)  # a first clause's submit -> its audio
        self.first_wait_seconds: deque[float] = deque(maxlen=1024)  # a first clause's submit -> its batch's start
        self._queue = DeadlineQueue()
        self._ready = threading.Condition()
        self._closed = False
        self._prepared = threading.Event()
        self._worker = threading.Thread(target=self._run, name="tts-batcher", daemon=True)
        self._worker.start()
        self._prepared.wait()

    def submit(
        self,
        text: str,
        *,
        speed: float = 1.0,
        voice: str | None = None,
        stream: Hashable | None = None,
        first: bool = True,
        cancel: threading.Event | None = None,
        on_audio: Callable[[np.ndarray], None] | None = None,
    ) -> Future[np.ndarray]:
        """Queue one clause of ``stream`` (None: a stream of its own); ``first`` marks a stream's first clause.
        ``on_audio`` gets the clause's samples piece by piece, on the worker thread, as they are rendered; the
        future resolves with all of them once the clause is complete."""
        clause = Clause(text, speed, voice, stream if stream is not None else object(), first, cancel, on_audio)
        with self._ready:
            if self._closed:
                raise RuntimeError("the TTS batcher was closed")
            self._queue.push(clause)
            self._ready.notify()
        return clause.future

    def synthesize(
        self, text: str, *, speed: float = 1.0, voice: str | None = None, cancel: threading.Event | None = None
    ) -> np.ndarray:
        return self.submit(text, speed=speed, voice=voice, cancel=cancel).result()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._worker.join()

    def _take(self) -> list[Clause] | None:
        with self._ready:
            if not wait_for_batch(
                self._ready, lambda: len(self._queue), lambda: self._closed, self.max_batch, self.window_s
            ):
                return None
            return self._queue.take(self.max_batch, self.max_later)

    def _run(self) -> None:
        try:
            self.synthesizer.prepare()
        except Exception:  # only a first batch's speed is at stake: serve anyway
            log.exception("preparing the TTS model for batches failed")
        finally:
            self._prepared.set()
        while (batch := self._take()) is not None:
            self._render(batch)

    def _render(self, batch: list[Clause]) -> None:
        """Render ``batch``, handing out each step's audio; between the steps of a batch without first
        clauses, render the first clauses that wait (whole: they are short)."""
        live = self._live(batch)
        if not live:
            return
        self.batch_sizes.append(len(live))
        preemptible = not any(c.first for c in live)
        parts: list[list[np.ndarray] | None] = [[] for _ in live]  # None once the clause is resolved
        spent = 0.0
        started = time.monotonic()
        self.first_wait_seconds.extend(started - c.submitted for c in live if c.first)
        try:
            render = self.synthesizer.start_batch([c.text for c in live], speed=live[0].speed, voice=live[0].voice)
            self.pass_seconds.append(time.monotonic() - started)
            while True:
                done = render.step()
                self._deliver(live, parts, render.take())
                if done:
                    break
                spent += time.monotonic() - started
                if all(c.cancel is not None and c.cancel.is_set() for c, p in zip(live, parts) if p is not None):
                    for clause, part in zip(live, parts):  # every listener is gone: the rest is not rendered
                        if part is not None:
                            self._resolve(clause, np.zeros(0, np.float32))
                    return
                while preemptible and (firsts := self._take_firsts()):
                    self._render(firsts)
                started = time.monotonic()
            spent += time.monotonic() - started
        except Exception as exc:  # each caller's failure; the worker keeps serving
            spent += time.monotonic() - started
            log.exception("a TTS batch of %d failed", len(live))
            for clause, part in zip(live, parts):
                if part is not None:
                    self._resolve(clause, exc)
        finally:
            self.batch_seconds.append(spent)
            self.busy_s += spent

    def _deliver(
        self, live: list[Clause], parts: list[list[np.ndarray] | None], pieces: list[tuple[np.ndarray, bool]]
    ) -> None:
        """Hand each clause its new samples; resolve the clauses now complete."""
        now = time.monotonic()
        for i, (clause, (samples, complete)) in enumerate(zip(live, pieces)):
            part = parts[i]
            if part is None:
                continue
            if clause.first and not part and (len(samples) or complete):
                self.first_clause_seconds.append(now - clause.submitted)
            if len(samples):
                part.append(samples)
                with self._ready:
                    self._queue.heard(clause, now, len(samples) / self.sample_rate)
                if clause.on_audio is not None:
                    try:
                        clause.on_audio(samples)
                    except Exception:  # the listener's fault; the batch's other clauses go on
                        log.exception("a TTS audio callback failed")
            if complete:
                parts[i] = None
                self._resolve(clause, np.concatenate(part) if part else np.zeros(0, np.float32))

    def _resolve(self, clause: Clause, outcome: np.ndarray | Exception) -> None:
        """Settle ``clause``'s future, and tell the queue it is no longer under way."""
        seconds = len(outcome) / self.sample_rate if isinstance(outcome, np.ndarray) else 0.0
        with self._ready:
            self._queue.done(clause, time.monotonic(), seconds)
        if isinstance(outcome, Exception):
            clause.future.set_exception(outcome)
        else:
            clause.future.set_result(outcome)

    def _take_firsts(self) -> list[Clause]:
        with self._ready:
            return self._queue.take(self.max_batch, max_later=0)

    def _live(self, batch: list[Clause]) -> list[Clause]:
        """The clauses of ``batch`` still wanted (a cancelled one resolves to no audio here)."""
        live = []
        for clause in batch:
            if not clause.future.set_running_or_notify_cancel():
                with self._ready:
                    self._queue.done(clause, time.monotonic(), 0.0)
                continue
            if clause.cancel is not None and clause.cancel.is_set():
                self._resolve(clause, np.zeros(0, np.float32))
                continue
            live.append(clause)
        return live
