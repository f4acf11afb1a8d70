"""Speech recognition for the pipeline: one recording, and every untranscribed audio part of a request.

A batching recognizer (one with ``enqueue``) lets concurrent turns share its batches; any other runs one
transcription at a time in a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable

from omni_gateway.omni.collaborators import Recognizer, Transcript
from omni_gateway.omni.protocol import AudioPart, InvalidInput, Message, OmniRequest, Transcription


async def transcribe_pcm16(
    asr: Recognizer,
    lock: threading.Lock,
    pcm16: bytes,
    sample_rate: int,
    *,
    language: str | None = None,
    prompt: str | None = None,
) -> Transcription:
    enqueue = getattr(asr, "enqueue", None)
    if enqueue is not None:  # a batching recognizer: concurrent turns share its batches
        # Converting the audio (decode, resample: 25 ms a minute of it) runs off the event loop; a caller
        # that leaves meanwhile has queued nothing.
        prepared = await asyncio.to_thread(
            asr.prepare, pcm16, sample_rate=sample_rate, language=language, prompt=prompt
        )
        job = enqueue(prepared)
        result = await asyncio.wrap_future(job)
    else:
        dropped = threading.Event()
        try:
            result = await asyncio.to_thread(
                _transcribe_locked, asr, lock, pcm16, sample_rate, language, prompt, dropped
            )
        except asyncio.CancelledError:
            dropped.set()  # still waiting for the recognizer: it never starts (the thread cannot be stopped)
            raise
        assert result is not None  # only a dropped call has none
    return Transcription(text=result.text, language=result.language, duration_s=result.duration_s)


def _transcribe_locked(
    asr: Recognizer,
    lock: threading.Lock,
    pcm16: bytes,
    sample_rate: int,
    language: str | None,
    prompt: str | None,
    dropped: threading.Event,
) -> Transcript | None:
    """One transcription at a time; one whose caller left while it waited (a speculation dropped because
    the speaker went on) is skipped, so it holds up none of the turns queued behind it."""
    with lock:
        if dropped.is_set():
            return None
        return asr.transcribe(pcm16, sample_rate=sample_rate, language=language, prompt=prompt)


async def transcribe_parts(
    request: OmniRequest, transcribe: Callable[[bytes, int], Awaitable[Transcription]]
) -> OmniRequest:
    """Give every audio part a transcript (HTTP input_audio parts arrive without one)."""
    if not any(isinstance(p, AudioPart) and p.transcript is None for m in request.messages for p in m.parts):
        return request
    messages = []
    for message in request.messages:
        parts = []
        for part in message.parts:
            if isinstance(part, AudioPart) and part.transcript is None:
                pcm16, rate = pcm16_of(part)
                text = (await transcribe(pcm16, rate)).text
                part = AudioPart(pcm16=pcm16, sample_rate=rate, transcript=text)
            parts.append(part)
        messages.append(Message(message.role, tuple(parts), message.tool_calls, message.tool_call_id))
    return dataclasses.replace(request, messages=tuple(messages))


def pcm16_of(part: AudioPart) -> tuple[bytes, int]:
    """The part's audio as 16-bit PCM and its rate, decoding an uploaded file."""
    encoded = getattr(part, "encoded", None)
    if encoded:
        from omni_gateway.encoders.audio import AudioDecodeError, decode_audio, float_to_pcm16

        try:
            decoded = decode_audio(encoded)
        except AudioDecodeError as exc:  # the client's upload: undecodable or over a limit
            raise InvalidInput(f"an input_audio part was refused: {exc}") from None
        return float_to_pcm16(decoded.samples), decoded.sample_rate
    return part.pcm16, part.sample_rate
