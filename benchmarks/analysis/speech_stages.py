"""``omni_speech --stages``: when each request passed the speech pipeline's stages, and how many rows each
batched token2wav call held.

``instrument`` wraps a thinker engine and a ``SpokenModel`` in place; a request sets ``CLOCK`` to its own
dict (``{"t0": start}``) before it starts, and each stage then records its seconds since ``t0`` once.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from benchmarks.analysis.step_timeline import chunk_kind

CLOCK: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("clock", default=None)
BATCHES: list[tuple[str, int]] = []  # (first / later / last chunk, rows) of each batched token2wav call
STAGES = (
    "thinker_first_token",  # the thinker's prefill and its first token reached the pipeline
    "talker_start",  # the talker's request was added (the thinker had its first reply row)
    "talker_first_code",
    "chunk_codes_ready",  # the talker made the codes the first token2wav chunk waits for
    "chunk_token2wav_s",  # the first chunk's token2wav call (waiting for its batch, DiT, vocoder), synchronized
    "first_audio",
)


def mark(clock: dict[str, float] | None, name: str, value: float | None = None) -> None:
    if clock is not None and name not in clock:
        clock[name] = value if value is not None else time.perf_counter() - clock["t0"]


def instrument(thinker: Any, speech: Any) -> None:
    """Wrap the pipeline's stages so each request's ``CLOCK`` records when it passed them, and count the rows
    of token2wav's batched calls in ``BATCHES``. A token2wav call returns its waveform on the host, so its
    wall time holds its device work without a synchronization of the device (which would also wait for
    the engines' steps and the other lanes' calls)."""

    def wrap_generate(engine: Any, first: str, start: str | None) -> None:
        inner = engine.generate

        async def generate(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            clock = CLOCK.get() if kwargs.get("request_id") else None
            if start is not None:
                mark(clock, start)
            async for delta in inner(*args, **kwargs):
                if delta.token_ids:
                    mark(clock, first)
                yield delta

        engine.generate = generate

    wrap_generate(thinker, "thinker_first_token", None)
    wrap_generate(speech.talker, "talker_first_code", "talker_start")
    t2w = speech.token2wav
    stream = t2w.stream

    def timed(name: str, fn: Callable[..., Any], clock: dict[str, float] | None) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if clock is None or name in clock:
                return fn(*args)
            t = time.perf_counter()
            out = fn(*args)  # returns the waveform on the host: the call's device work is done
            clock[name] = time.perf_counter() - t
            return out

        return call

    group = t2w._chunk_group

    def counted(calls: list[tuple[Any, ...]], lane: int = 0) -> Any:
        BATCHES.append((chunk_kind(calls[0][4]), len(calls)))
        return group(calls, lane)

    t2w._chunk_group = counted  # before the first stream starts the worker that calls it

    def started(voice: str, *, seed: int | None = None) -> Any:
        s = stream(voice, seed=seed)
        clock = CLOCK.get()
        push = s.push

        def timed_push(codes: list[int], **kwargs: Any) -> Any:
            if len(s.codes) + len(codes) >= s.next_chunk_end + t2w.config.lookahead_codes:
                mark(clock, "chunk_codes_ready")
            return push(codes, **kwargs)

        s.push = timed_push
        s.t2w = _Timed(t2w, timed("chunk_token2wav_s", t2w.chunk_batched, clock))
        return s

    t2w.stream = started


class _Timed:
    """A Token2Wav seen by one stream, whose batched calls are timed."""

    def __init__(self, t2w: Any, chunk: Callable[..., Any]) -> None:
        self._t2w, self.chunk_batched = t2w, chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t2w, name)
