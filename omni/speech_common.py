"""What the speaking models' drivers (``omni.speech``, ``omni.qwen3_speech``) do alike around their talkers.

Both run a turn the same way: the thinker streams its answer with hidden states, its text waits in a ``Turn``
until audio carries it, its rows start a talker once the first reply token is in, and the talker's waveform goes
out as 100 ms PCM ``AudioChunk``s. What the talker is fed and how its codes become sound is each driver's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
from omni_gateway.engine.errors import EngineDead, EngineOverloaded, InvalidRequest
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.protocol import AudioChunk, Done, Error, OmniRequest, OutputChunk
from omni_gateway.omni.streams import Prompt, refusal, usage

if TYPE_CHECKING:
    import torch
    from omni_gateway.engine.outputs import StreamDelta
    from omni_gateway.omni.collaborators import Engine

CHUNK_MS = 100
REFUSED = (InvalidRequest, EngineOverloaded, EngineDead)  # what an engine raises for a request it will not run

Start = TypeVar("Start")


class Turn(Generic[Start]):
    """What the thinker side of one turn has produced, shared with the talker side. ``started`` holds what
    starts the talker, or None where the thinker ended before it could."""

    def __init__(self) -> None:
        self.text = ""  # transcript not yet sent with audio
        self.finals: list[StreamDelta] = []
        self.failure: Error | None = None
        self.started: asyncio.Future[Start | None] = asyncio.get_running_loop().create_future()

    def take_text(self) -> str:
        text, self.text = self.text, ""
        return text


class ThinkerRows:
    """The thinker's input-embedding rows of a few token ids (the talker's text tokens), asked of it once."""

    def __init__(self) -> None:
        self._rows: dict[int, torch.Tensor] = {}

    async def get(self, thinker: Engine, token_ids: tuple[int, ...]) -> list[torch.Tensor]:
        missing = [t for t in token_ids if t not in self._rows]
        if missing:
            params = SamplingParams(max_tokens=1, temperature=0.0, return_hidden_states=True)
            async for delta in thinker.generate(missing, params):
                if delta.input_embeds is not None:
                    for i, row in enumerate(delta.input_embeds):
                        self._rows[missing[delta.hidden_start + i]] = row
        return [self._rows[t] for t in token_ids]


async def run_thinker(
    thinker: Engine,
    request: OmniRequest,
    prompt: Prompt,
    params: SamplingParams,
    turn: Turn[Start],
    on_delta: Callable[[StreamDelta, list[int]], None],
) -> None:
    """Run the thinker of a spoken turn: its text into ``turn.text``, its end or failure into ``turn``. Each
    delta, with the reply's tokens so far, goes to ``on_delta``, which feeds the talker. Whatever ``on_delta``
    raises ends the turn and reaches the caller; ``turn.started`` is settled either way."""
    reply: list[int] = []  # the thinker's tokens so far
    kwargs = {"embed_spans": prompt.embed_spans} if prompt.embed_spans else {}
    try:
        async for delta in thinker.generate(
            prompt.token_ids, params, request_id=request.request_id, priority=request.priority, **kwargs
        ):
            if delta.error is not None:
                turn.failure = Error("engine_error", delta.error, status=500)
                break
            turn.text += delta.text
            reply += delta.token_ids
            on_delta(delta, reply)
            if delta.finished:
                turn.finals.append(delta)
                break
    except REFUSED as exc:
        turn.failure = refusal(exc)
    finally:
        if not turn.started.done():
            turn.started.set_result(None)


async def spoken_turn(
    turn: Turn[Start],
    thinking: asyncio.Task[None],
    audio: Callable[[Start], AsyncIterator[np.ndarray]],
    prompt: Prompt,
    rate: int,
    source_rate: int,
    cancel: asyncio.Event,
) -> AsyncIterator[OutputChunk]:
    """A turn's output once its thinker runs (``thinking``): the talker's waveform (``audio`` of what started
    it, at ``source_rate``) as ``AudioChunk``s at ``rate`` carrying the text received since the chunk before,
    then the text no audio carried, ``Done`` and ``Usage``; or the turn's failure."""
    samples = 0
    try:
        start = await turn.started
        if start is not None and not cancel.is_set():
            async with contextlib.aclosing(audio(start)) as waves:
                async for wave in waves:
                    for index, piece in enumerate(pcm16_slices(wave, rate, source_rate)):
                        samples += len(piece) // 2
                        yield AudioChunk(piece, rate, turn.take_text() if index == 0 else "")
        await thinking
    finally:
        thinking.cancel()
        await asyncio.gather(thinking, return_exceptions=True)
    if turn.failure is not None:
        yield turn.failure
        return
    if turn.text:  # text the audio did not carry (a reply too short to speak)
        yield AudioChunk(b"", rate, turn.take_text())
    reason = "abort" if cancel.is_set() else (turn.finals[0].finish_reason if turn.finals else "abort")
    yield Done(reason or "stop")
    counted = usage(turn.finals, prompt)
    yield dataclasses.replace(counted, output_audio_tokens=round(samples / rate * 20))


class Playback:
    """When one stream's listener runs out of audio: playback starts with its first audio handed out, and the
    audio handed out since is queued at the listener. A chunk's ``deadline`` tells the batched chunk calls
    (``token2wav.batcher``) which streams to serve first."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._seconds = 0.0

    def deadline(self) -> float:
        """``time.monotonic()`` seconds at which the audio handed out so far has played (now, before any)."""
        return time.monotonic() if self._started is None else self._started + self._seconds

    def delivered(self, samples: int, rate: int) -> None:
        if self._started is None:
            self._started = time.monotonic()
        self._seconds += samples / rate


def warm_up_turn(
    speak: Callable[..., AsyncIterator[OutputChunk]], thinker: Engine, prompt_ids: list[int], voice: str
) -> None:
    """One short spoken turn through ``speak`` (a model's ``speak``), on an event loop of its own thread: the
    loader calling it may run inside one."""
    from concurrent.futures import ThreadPoolExecutor

    from omni_gateway.omni.protocol import AudioOutputOptions, Message, TextPart

    request = OmniRequest(
        "warm-up-speech",
        (Message("user", (TextPart("Hello."),)),),
        modalities=("text", "audio"),
        audio=AudioOutputOptions(voice=voice),
    )
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    async def run() -> None:
        async for _ in speak(thinker, request, Prompt(prompt_ids), params, asyncio.Event()):
            pass

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, run()).result()


def talker_id(request_id: str) -> str:
    return f"{request_id}-talker"


def pcm16_slices(wave: np.ndarray, rate: int, source_rate: int) -> Iterator[bytes]:
    """A float waveform at ``source_rate`` as 16-bit PCM at ``rate``, in ``CHUNK_MS`` slices."""
    from omni_gateway.encoders.audio import float_to_pcm16_array, resample

    pcm = float_to_pcm16_array(resample(wave, source_rate, rate) if rate != source_rate else wave)
    step = rate * CHUNK_MS // 1000
    for start in range(0, len(pcm), step):
        yield pcm[start : start + step].tobytes()
