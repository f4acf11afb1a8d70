"""Streaming TTS head: text deltas in, 100 ms pcm16 audio chunks out.

Text is cut into clause/sentence segments (``TextChunker``) while it still arrives, and each segment is
rendered in a worker thread, resampled to the requested rate and sliced into chunks. The first chunk of a
segment carries that segment's text, so transcript deltas stay in step with the audio.

With a synthesizer that batches streams (``BatchedSynthesizer``) a segment is queued as soon as the chunker
cuts it, up to ``lookahead`` segments ahead of the one being streamed out, and its audio goes out piece by
piece as it renders: the next clause is ready before the listener reaches it. A synthesizer that renders on
the caller's thread gets one segment at a time, when the consumer asks for it: rendered ahead, a later
clause would take cores from other sessions' first audio.
Closing or cancelling the stream sets a flag the workers check between steps, and no further segment is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import numpy as np
from omni_gateway.encoders.audio import StreamResampler, float_to_pcm16_array, resample
from omni_gateway.omni.heads.tts.backends import SpeechSynthesizer, load_synthesizer
from omni_gateway.omni.heads.tts.batch import BatchedSynthesizer
from omni_gateway.omni.heads.tts.text_chunker import ChunkerConfig, TextChunker
from omni_gateway.omni.protocol import AudioChunk, AudioOutputOptions

CHUNK_MS = 100
MIN_SPEED, MAX_SPEED = 0.25, 4.0
BATCHED_LOOKAHEAD = 3  # segments queued ahead of the one streaming out, with a batching synthesizer


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


_END = object()


@dataclass(slots=True)
class _Segment:
    text: str  # as the chunker cut it: the transcript piece
    pieces: asyncio.Queue[object] = field(default_factory=asyncio.Queue)  # float32 audio, then _END or _Failed
    render: asyncio.Task[None] | None = None  # the render on the caller's thread pool, if it is one


class TtsHead:
    def __init__(
        self, synthesizer: SpeechSynthesizer, *, chunker: ChunkerConfig = ChunkerConfig(), lookahead: int | None = None
    ) -> None:
        """``lookahead``: segments rendered ahead of the one streaming out; by default ``BATCHED_LOOKAHEAD``
        with a synthesizer that batches streams (``submit``), else 0."""
        if lookahead is not None and lookahead < 0:
            raise ValueError(f"lookahead must be >= 0; got {lookahead}")
        self.synthesizer = synthesizer
        self.chunker = chunker
        batching = hasattr(synthesizer, "submit")
        self.lookahead = lookahead if lookahead is not None else BATCHED_LOOKAHEAD if batching else 0
        # a stream's start -> its first spoken segment handed to the synthesizer: the text source's share
        # of first audio (an LLM's first tokens), for benchmarks; and -> the first text that came at all (the
        # LLM's first token, so the rest is the tokens the segment waited for)
        self.first_segment_seconds: deque[float] = deque(maxlen=1024)
        self.first_text_seconds: deque[float] = deque(maxlen=1024)

    @classmethod
    def load(cls, spec: str, *, device: str = "auto", seed: int | None = None, threads: int = 0) -> TtsHead:
        synthesizer = load_synthesizer(spec, device=device, seed=seed, threads=threads)
        if hasattr(synthesizer, "synthesize_batch"):  # a torch model: concurrent streams share its batches
            synthesizer = BatchedSynthesizer(synthesizer)
        return cls(synthesizer)

    @property
    def voices(self) -> tuple[str, ...]:
        return self.synthesizer.voices

    def close(self) -> None:
        """Stop the synthesizer's batch worker, if it has one, once its queued clauses are done."""
        close = getattr(self.synthesizer, "close", None)
        if close is not None:
            close()

    def synthesize(self, text: str, options: AudioOutputOptions = AudioOutputOptions()) -> np.ndarray:
        """Whole text at once (``/v1/audio/speech``): float32 mono at ``options.sample_rate``.

        Rendered segment by segment, as when streaming, so long inputs never go through the model in one piece;
        nothing waits for the first audio here, so the first segment is a whole clause too.
        """
        _check(options)
        chunker = TextChunker(replace(self.chunker, first_max_words=None, growth=None))
        segments = [s.strip() for s in chunker.push(text) + chunker.flush()]
        pieces = [self.synthesizer.synthesize(s, speed=options.speed, voice=options.voice) for s in segments if s]
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        return resample(audio, self.synthesizer.sample_rate, options.sample_rate)

    async def stream(
        self, text_deltas: AsyncIterator[str], options: AudioOutputOptions = AudioOutputOptions()
    ) -> AsyncIterator[AudioChunk]:
        _check(options)
        began = time.monotonic()
        cancel = threading.Event()
        texts: asyncio.Queue[object] = asyncio.Queue()  # segments' texts, then _END or _Failed
        segments: asyncio.Queue[object] = asyncio.Queue()  # _Segments rendering, in the reply's order
        slots = asyncio.Semaphore(self.lookahead + 1)  # segments started and not yet streamed out
        tasks = [
            asyncio.create_task(self._read(text_deltas, texts, began)),
            asyncio.create_task(self._start_renders(texts, segments, slots, options, cancel, began)),
        ]
        carried = ""  # text of segments that produced no audio, passed on to the next chunk's transcript
        try:
            while True:
                item = await segments.get()
                if item is _END:
                    break
                if isinstance(item, _Failed):
                    raise item.error
                assert isinstance(item, _Segment)
                text = carried + item.text
                spoken = False
                async for pcm in self._chunks(item, options):
                    if spoken:  # a piece is seconds of chunks at once: other streams run between them
                        await asyncio.sleep(0)
                    yield AudioChunk(pcm, options.sample_rate, "" if spoken else text)
                    spoken = True
                carried = "" if spoken else text
                slots.release()
            if carried.strip():  # text the audio did not carry (a reply too short to speak)
                yield AudioChunk(b"", options.sample_rate, carried)
        finally:
            cancel.set()
            for task in tasks:
                task.cancel()

    async def _read(self, text_deltas: AsyncIterator[str], texts: asyncio.Queue[object], began: float) -> None:
        chunker = TextChunker(self.chunker)
        first = True
        try:
            async for delta in text_deltas:
                if first and delta:
                    self.first_text_seconds.append(time.monotonic() - began)
                    first = False
                for segment in chunker.push(delta):
                    texts.put_nowait(segment)
            for segment in chunker.flush():
                texts.put_nowait(segment)
            texts.put_nowait(_END)
        except Exception as exc:  # handed to the consumer, which raises it where the caller sees it
            texts.put_nowait(_Failed(exc))

    async def _start_renders(
        self,
        texts: asyncio.Queue[object],
        segments: asyncio.Queue[object],
        slots: asyncio.Semaphore,
        options: AudioOutputOptions,
        cancel: threading.Event,
        began: float,
    ) -> None:
        """Start each segment's render once a slot is free, and queue it for the consumer in order."""
        first = True  # the stream's first spoken segment, served ahead of other streams' later ones
        while True:
            item = await texts.get()
            if not isinstance(item, str):
                segments.put_nowait(item)
                return
            await slots.acquire()
            if first and item.strip():
                self.first_segment_seconds.append(time.monotonic() - began)
            try:
                segments.put_nowait(self._render(item, options, cancel, first))
            except Exception as exc:  # the synthesizer refused it (closed): the consumer raises it
                segments.put_nowait(_Failed(exc))
                return
            first = first and not item.strip()

    def _render(self, text: str, options: AudioOutputOptions, cancel: threading.Event, first: bool) -> _Segment:
        """Start rendering one segment; its audio arrives in the segment's ``pieces``."""
        segment = _Segment(text)
        spoken = text.strip()
        if not spoken or cancel.is_set():
            segment.pieces.put_nowait(_END)
            return segment
        loop = asyncio.get_running_loop()

        def put(item: object) -> None:  # from the synthesizer's thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens any more
                loop.call_soon_threadsafe(segment.pieces.put_nowait, item)

        submit = getattr(self.synthesizer, "submit", None)
        if submit is not None:
            voice, speed = options.voice, options.speed
            job: Future[np.ndarray] = submit(
                spoken, speed=speed, voice=voice, stream=cancel, first=first, cancel=cancel, on_audio=put
            )
            job.add_done_callback(lambda done: put(_outcome(done)))
        else:
            segment.render = asyncio.create_task(self._render_alone(spoken, options, cancel, segment.pieces))
        return segment

    async def _render_alone(
        self, text: str, options: AudioOutputOptions, cancel: threading.Event, pieces: asyncio.Queue[object]
    ) -> None:
        try:
            audio = await asyncio.to_thread(
                self.synthesizer.synthesize, text, speed=options.speed, voice=options.voice, cancel=cancel
            )
        except Exception as exc:
            pieces.put_nowait(_Failed(exc))
            return
        pieces.put_nowait(audio)
        pieces.put_nowait(_END)

    async def _chunks(self, segment: _Segment, options: AudioOutputOptions) -> AsyncIterator[bytes]:
        """A segment's audio as 100 ms pcm16 chunks at the options' rate, as its pieces arrive."""
        resampler = StreamResampler(self.synthesizer.sample_rate, options.sample_rate)
        step = options.sample_rate * CHUNK_MS // 1000
        pending = np.zeros(0, "<i2")
        while True:
            piece = await segment.pieces.get()
            if isinstance(piece, _Failed):
                raise piece.error
            last = piece is _END
            audio = np.zeros(0, np.float32) if last else np.asarray(piece, np.float32)
            pending = np.concatenate([pending, float_to_pcm16_array(resampler.process(audio, last=last))])
            whole = len(pending) if last else len(pending) // step * step
            for start in range(0, whole, step):
                yield pending[start : start + step].tobytes()
            pending = pending[whole:]
            if last:
                return


def _outcome(job: Future[np.ndarray]) -> object:
    error = None if job.cancelled() else job.exception()
    return _END if error is None else _Failed(error)


def _check(options: AudioOutputOptions) -> None:
    if not MIN_SPEED <= options.speed <= MAX_SPEED:
        raise ValueError(f"speech speed must lie in [{MIN_SPEED}, {MAX_SPEED}]; got {options.speed}")
    if options.sample_rate < 8000 or options.sample_rate % (1000 // CHUNK_MS):
        raise ValueError(f"output sample rate must be >= 8000 Hz and a multiple of 10; got {options.sample_rate}")
