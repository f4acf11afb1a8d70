"""Speech from many streams synthesized in shared batches, scheduled for first audio.

Every spoken response is a stream of clauses, queued as its text arrives. A worker thread forms each batch
from what waits: first clauses before anything else, in arrival order (a session's first audio matters
more than throughput); then the other streams' clauses round-robin, the stream served longest ago first,
one clause per stream per round, so a long answer never holds up another session's audio. A batch shares
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

import itertools
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


class FairQueue:
    """The scheduling rule above, as pure state (no threads, no clock)."""

    def __init__(self) -> None:
        self._firsts: deque[Clause] = deque()
        self._streams: dict[Hashable, deque[Clause]] = {}  # in round-robin order: served longest ago first

    def __len__(self) -> int:
        return len(self._firsts) + sum(len(q) for q in self._streams.values())

    def push(self, clause: Clause) -> None:
        if clause.first:
            self._firsts.append(clause)
        else:
            self._streams.setdefault(clause.stream, deque()).append(clause)

    def take(self, max_batch: int, max_later: int | None = None) -> list[Clause]:
        """The next batch, at most ``max_later`` (default ``max_batch``) of it later clauses; empty when
        nothing waits."""
        later_left = max_batch if max_later is None else max_later
        order = [*self._firsts, *self._round_robin()]
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

    def _round_robin(self) -> list[Clause]:
        queues = [list(q) for q in self._streams.values()]
        return [c for rank in itertools.zip_longest(*queues) for c in rank if c is not None]

    def _remove(self, clause: Clause) -> None:
        if clause.first:
            self._firsts.remove(clause)
            return
        queue = self._streams.pop(clause.stream)
        queue.remove(clause)
        if queue:
            self._streams[clause.stream] = queue  # to the back of the rotation: it was just served


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
        self._queue = FairQueue()
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
                            clause.future.set_result(np.zeros(0, np.float32))
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
                    clause.future.set_exception(exc)
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
                if clause.on_audio is not None:
                    try:
                        clause.on_audio(samples)
                    except Exception:  # the listener's fault; the batch's other clauses go on
                        log.exception("a TTS audio callback failed")
            if complete:
                parts[i] = None
                clause.future.set_result(np.concatenate(part) if part else np.zeros(0, np.float32))

    def _take_firsts(self) -> list[Clause]:
        with self._ready:
            return self._queue.take(self.max_batch, max_later=0)

    @staticmethod
    def _live(batch: list[Clause]) -> list[Clause]:
        """The clauses of ``batch`` still wanted (a cancelled one resolves to no audio here)."""
        live = []
        for clause in batch:
            if not clause.future.set_running_or_notify_cancel():
                continue
            if clause.cancel is not None and clause.cancel.is_set():
                clause.future.set_result(np.zeros(0, np.float32))
                continue
            live.append(clause)
        return live
