"""Test doubles of the model side: a scripted ``OmniBackend`` and an amplitude-driven VAD."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    Capabilities,
    Done,
    Health,
    ImageFinal,
    ImagePartial,
    Message,
    OmniRequest,
    OutputChunk,
    TextDelta,
    Transcription,
    Usage,
    VadEvent,
    VadSettings,
)

RATE = 24000
FRAME = RATE // 100  # 10 ms


def tone(ms: int, amplitude: int = 20000, freq: float = 220.0) -> bytes:
    """``ms`` of a sine at ``amplitude`` as 24 kHz pcm16: "speech" for the amplitude VAD."""
    t = np.arange(ms * RATE // 1000) / RATE
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(ms * RATE // 1000 * 2)


class AmplitudeVad:
    """Speech is any 10 ms frame whose peak reaches ``threshold`` of full scale; VAD timings and events
    (pause and resume hints included) as the real one."""

    def __init__(self, settings: VadSettings) -> None:
        self.settings = settings
        self.reset()

    def reset(self) -> None:
        self._ms = 0
        self._rest = b""
        self._speaking = False
        self._silence_ms = 0

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        data = self._rest + pcm16
        usable = len(data) - len(data) % (FRAME * 2)
        self._rest = data[usable:]
        events: list[VadEvent] = []
        samples = np.frombuffer(data[:usable], dtype="<i2").reshape(-1, FRAME)
        for frame in samples:
            loud = int(np.abs(frame.astype(np.int32)).max()) >= self.settings.threshold * 32767
            if loud and not self._speaking:
                self._speaking = True
                events.append(VadEvent("speech_started", max(0, self._ms - self.settings.prefix_padding_ms)))
            elif self._speaking and loud and self._silence_ms:
                events.append(VadEvent("speech_resumed", self._ms))
            elif self._speaking and not loud and not self._silence_ms:
                events.append(VadEvent("speech_paused", self._ms))
            self._ms += 10
            if self._speaking:
                self._silence_ms = 0 if loud else self._silence_ms + 10
                if self._silence_ms >= self.settings.silence_duration_ms:
                    self._speaking = False
                    events.append(VadEvent("speech_stopped", self._ms))
        return events


def png(width: int = 2, height: int = 2, shade: int = 0) -> bytes:
    """A small valid PNG (RGB, one flat colour): what the image scripts and image inputs carry."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 255 - shade, 128)).save(out, format="PNG")
    return out.getvalue()


def words_of(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


class FakeBackend:
    """Answers every request with ``reply`` word by word: TextDelta per word, or for audio one 100 ms
    AudioChunk per word carrying that word as its transcript. ``gate`` (when set) holds each stream
    before its first chunk until the test releases it. With ``image_out`` a request for "image" gets
    ``partial_images`` previews (``preview_every`` > 0 only) and one final PNG; ``vision`` says whether
    its capabilities list image input."""

    def __init__(
        self,
        reply: str = "Hello from the fake model.",
        *,
        transcript: str = "what the user said",
        vad: bool = True,
        audio_out: bool = True,
        chunk_delay: float = 0.0,
        script: Callable[[OmniRequest], Sequence[OutputChunk]] | None = None,
        fail_transcription: bool = False,
        image_out: bool = False,
        vision: bool = True,
        partial_images: int = 2,
    ) -> None:
        self.reply = reply
        self.transcript = transcript
        self.vad_enabled = vad
        self.chunk_delay = chunk_delay
        self.script = script
        self.fail_transcription = fail_transcription
        self.partial_images = partial_images
        self.gate: asyncio.Event | None = None
        self.requests: list[OmniRequest] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.transcribed: list[bytes] = []
        self.vad_settings: list[VadSettings] = []
        self.capabilities = Capabilities(
            model="fake-omni",
            input_modalities=frozenset({"text", "audio"} | ({"image"} if vision else set())),
            output_modalities=frozenset(
                {"text"} | ({"audio"} if audio_out else set()) | ({"image"} if image_out else set())
            ),
            voices=("alloy", "verse"),
            max_context_tokens=4096,
        )

    def chunks(self, request: OmniRequest) -> list[OutputChunk]:
        if self.script is not None:
            return list(self.script(request))
        if "image" in request.modalities:
            previews = self.partial_images if request.image.preview_every else 0
            return [
                *(ImagePartial(index=k, png=png(shade=k + 1), step=k + 1) for k in range(previews)),
                ImageFinal(png=png(*request.image.size), seed=request.image.seed),
                Done("stop"),
            ]
        words = words_of(self.reply)
        if "audio" in request.modalities:
            body: list[OutputChunk] = [AudioChunk(tone(100), RATE, transcript=w) for w in words]
        else:
            body = [TextDelta(w) for w in words]
        return [
            *body,
            Usage(
                input_tokens=self.count_tokens(request.messages),
                output_tokens=len(words),
                output_audio_tokens=len(words) if "audio" in request.modalities else 0,
            ),
            Done("stop"),
        ]

    async def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        self.requests.append(request)
        try:
            if self.gate is not None:
                await self.gate.wait()
            for chunk in self.chunks(request):
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                yield chunk
        finally:
            self.closed.append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def transcribe(
        self, pcm16: bytes, sample_rate: int, *, language: str | None = None, prompt: str | None = None
    ) -> Transcription:
        self.transcribed.append(pcm16)
        if self.fail_transcription:
            raise RuntimeError("ASR exploded")
        return Transcription(self.transcript, language="en", duration_s=len(pcm16) / (2 * sample_rate))

    async def synthesize(self, text: str, options: AudioOutputOptions) -> AsyncIterator[AudioChunk]:
        for word in words_of(text):
            yield AudioChunk(tone(100), RATE, transcript=word)

    def new_vad(self, settings: VadSettings) -> AmplitudeVad:
        if not self.vad_enabled:
            raise RuntimeError("VAD disabled")
        self.vad_settings.append(settings)
        return AmplitudeVad(settings)

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        return sum(len(m.text.split()) for m in messages)

    def health(self) -> Health:
        return Health(True)

    def metrics(self) -> dict[str, float]:
        return {"requests": float(len(self.requests))}
