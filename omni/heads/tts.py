"""Streaming TTS head: text deltas in, 100 ms pcm16 audio chunks out.

Text is cut into clause/sentence segments (``TextChunker``) while it still arrives; each segment is
rendered whole in a worker thread, resampled to the requested rate and sliced into chunks. The first
chunk of a segment carries that segment's text, so transcript deltas stay in step with the audio.
Closing or cancelling the stream sets a flag the worker checks between sentences, and no further
segment is started.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace

import numpy as np
from omni_gateway.encoders.audio import float_to_pcm16_array, resample
from omni_gateway.omni.heads.text_chunker import ChunkerConfig, TextChunker
from omni_gateway.omni.heads.tts_backends import SpeechSynthesizer, load_synthesizer
from omni_gateway.omni.heads.tts_batch import BatchedSynthesizer
from omni_gateway.omni.protocol import AudioChunk, AudioOutputOptions

CHUNK_MS = 100
MIN_SPEED, MAX_SPEED = 0.25, 4.0


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


_END = object()


class TtsHead:
    def __init__(self, synthesizer: SpeechSynthesizer, *, chunker: ChunkerConfig = ChunkerConfig()) -> None:
        self.synthesizer = synthesizer
        self.chunker = chunker

    @classmethod
    def load(cls, spec: str, *, device: str = "auto", seed: int | None = None, threads: int = 0) -> TtsHead:
        synthesizer = load_synthesizer(spec, device=device, seed=seed, threads=threads)
        if hasattr(synthesizer, "synthesize_batch"):  # a torch model: concurrent streams share its batches
            synthesizer = BatchedSynthesizer(synthesizer)
        return cls(synthesizer)

    @property
    def voices(self) -> tuple[str, ...]:
        return self.synthesizer.voices

    def synthesize(self, text: str, options: AudioOutputOptions = AudioOutputOptions()) -> np.ndarray:
        """Whole text at once (``/v1/audio/speech``): float32 mono at ``options.sample_rate``.

        Rendered segment by segment, as when streaming, so long inputs never go through the model in one piece;
        nothing waits for the first audio here, so the first segment is a whole clause too.
        """
        _check(options)
        chunker = TextChunker(replace(self.chunker, first_max_words=None))
        segments = [s.strip() for s in chunker.push(text) + chunker.flush()]
        pieces = [self.synthesizer.synthesize(s, speed=options.speed, voice=options.voice) for s in segments if s]
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        return resample(audio, self.synthesizer.sample_rate, options.sample_rate)

    async def stream(
        self, text_deltas: AsyncIterator[str], options: AudioOutputOptions = AudioOutputOptions()
    ) -> AsyncIterator[AudioChunk]:
        _check(options)
        cancel = threading.Event()
        segments: asyncio.Queue[object] = asyncio.Queue()
        reader = asyncio.create_task(self._read(text_deltas, segments))
        carried = ""  # text of segments that produced no audio, passed on to the next chunk's transcript
        first = True
        try:
            while True:
                item = await segments.get()
                if item is _END:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                text = carried + str(item)
                pcm = await self._render(text.strip(), options, cancel, first)
                carried, first = text, first and not len(pcm)
                for index, piece in enumerate(_slices(pcm, options.sample_rate)):
                    if index:  # a clause is seconds of chunks at once: other streams run between them
                        await asyncio.sleep(0)
                    yield AudioChunk(piece, options.sample_rate, text if index == 0 else "")
                    carried = ""
        finally:
            cancel.set()
            reader.cancel()

    async def _read(self, text_deltas: AsyncIterator[str], segments: asyncio.Queue[object]) -> None:
        chunker = TextChunker(self.chunker)
        try:
            async for delta in text_deltas:
                for segment in chunker.push(delta):
                    segments.put_nowait(segment)
            for segment in chunker.flush():
                segments.put_nowait(segment)
            segments.put_nowait(_END)
        except Exception as exc:  # handed to the consumer, which raises it where the caller sees it
            segments.put_nowait(_Failed(exc))

    async def _render(self, text: str, options: AudioOutputOptions, cancel: threading.Event, first: bool) -> np.ndarray:
        """One segment as pcm16 at the options' rate; a batching synthesizer gets it as this stream's
        clause (``first``: the stream's first, served ahead of other streams' later clauses)."""
        if not text or cancel.is_set():
            return np.zeros(0, "<i2")
        submit = getattr(self.synthesizer, "submit", None)
        if submit is None:
            return await asyncio.to_thread(self._render_alone, text, options, cancel)
        job = submit(text, speed=options.speed, voice=options.voice, stream=cancel, first=first, cancel=cancel)
        return await asyncio.to_thread(self._to_pcm16, await asyncio.wrap_future(job), options)

    def _render_alone(self, text: str, options: AudioOutputOptions, cancel: threading.Event) -> np.ndarray:
        audio = self.synthesizer.synthesize(text, speed=options.speed, voice=options.voice, cancel=cancel)
        return self._to_pcm16(audio, options)

    def _to_pcm16(self, audio: np.ndarray, options: AudioOutputOptions) -> np.ndarray:
        return float_to_pcm16_array(resample(audio, self.synthesizer.sample_rate, options.sample_rate))


def _check(options: AudioOutputOptions) -> None:
    if not MIN_SPEED <= options.speed <= MAX_SPEED:
        raise ValueError(f"speech speed must lie in [{MIN_SPEED}, {MAX_SPEED}]; got {options.speed}")
    if options.sample_rate < 8000 or options.sample_rate % (1000 // CHUNK_MS):
        raise ValueError(f"output sample rate must be >= 8000 Hz and a multiple of 10; got {options.sample_rate}")


def _slices(pcm: np.ndarray, rate: int) -> Iterator[bytes]:
    step = rate * CHUNK_MS // 1000
    for start in range(0, len(pcm), step):
        yield pcm[start : start + step].tobytes()
