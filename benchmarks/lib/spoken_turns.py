"""One spoken turn of a speaking model's driver (``omni.speech``, ``omni.qwen3_speech``), timed without a web stack:
the speech benchmarks send these and read first audio, wall time and real-time factor off them alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SpokenTurn:
    """``arrivals``: (seconds after the request was handed over, PCM samples) of each audio chunk, in order."""

    wall_s: float
    arrivals: list[tuple[float, int]]
    sample_rate: int


async def speak_timed(
    speech: Any,
    thinker: Any,
    index: int,
    prompt: list[int],
    params: Any,
    voice: str,
    sample_rate: int | None = None,
    on_audio: Callable[[], None] | None = None,
) -> SpokenTurn:
    """The ``index``-th request of a run (its seed) spoken by ``speech.speak`` in ``voice``; ``sample_rate`` None:
    the request's default. ``on_audio`` is called at each audio chunk."""
    from omni_gateway.omni.protocol import AudioChunk, AudioOutputOptions, OmniRequest, SamplingOptions
    from omni_gateway.omni.streams import Prompt

    audio = AudioOutputOptions(voice=voice) if sample_rate is None else AudioOutputOptions(voice, sample_rate)
    request = OmniRequest(
        request_id=f"bench-{time.monotonic_ns()}-{index}",
        messages=(),
        modalities=("text", "audio"),
        sampling=SamplingOptions(seed=index),
        audio=audio,
    )
    start = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    async for chunk in speech.speak(thinker, request, Prompt(prompt), params, asyncio.Event()):
        if isinstance(chunk, AudioChunk) and chunk.pcm16:
            arrivals.append((time.perf_counter() - start, len(chunk.pcm16) // 2))
            if on_audio is not None:
                on_audio()
    return SpokenTurn(time.perf_counter() - start, arrivals, audio.sample_rate)


def speech_times(first_audio_s: float, wall_s: float, audio_s: float) -> dict[str, float]:
    """A spoken request's record: first audio, wall time, seconds of audio and the real-time factor (wall time per
    second of audio; 0 where there was none)."""
    return {
        "first_audio_s": first_audio_s,
        "wall_s": wall_s,
        "audio_s": audio_s,
        "rtf": wall_s / audio_s if audio_s else 0.0,
    }
