"""The one test double of the model side: a scripted ``OmniBackend`` (with an amplitude-driven VAD) that the
realtime, HTTP and demo tests all serve, plus the audio and image inputs they feed it."""

from __future__ import annotations

import asyncio
import io
import math
import zlib
from collections.abc import AsyncIterator, Callable

import numpy as np
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    Capabilities,
    Done,
    EmbeddingRequest,
    Embeddings,
    Error,
    Health,
    ImageFinal,
    ImagePartial,
    InvalidInput,
    Message,
    OmniRequest,
    OutputChunk,
    TextDelta,
    ToolCallDelta,
    Transcription,
    Usage,
    VadEvent,
    VadSettings,
)

RATE = 24000
FRAME = RATE // 100  # 10 ms


def tone(ms: int, amplitude: int = 20000, freq: float = 220.0, rate: int = RATE) -> bytes:
    """``ms`` of a sine at ``amplitude`` as pcm16 (24 kHz unless said): "speech" for the amplitude VAD."""
    t = np.arange(ms * rate // 1000) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(ms * RATE // 1000 * 2)


def png(width: int = 2, height: int = 2, shade: int = 0) -> bytes:
    """A small valid PNG (RGB, one flat colour): what the image scripts and image inputs carry."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 255 - shade, 128)).save(out, format="PNG")
    return out.getvalue()


def words_of(text: str) -> list[str]:
    """``text`` as the deltas a model streams: each word after the first carries its leading space."""
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def overloaded(status: int = 503) -> list[OutputChunk]:
    return [Error(code="overloaded", message="the engine queue is full; retry later", status=status), Done("error")]


def tool_call_script() -> list[OutputChunk]:
    return [
        ToolCallDelta(call_id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
        Done("stop"),
        Usage(input_tokens=5, output_tokens=7),
    ]


class AmplitudeVad:
    """Speech is any 10 ms frame whose peak reaches ``threshold`` of full scale; VAD timings and events
    (pause and resume hints included) as the real one."""

    def __init__(self, settings: VadSettings) -> None:
        self.settings = settings
        self.words: list[str | None] = []
        self.reset()

    def reset(self) -> None:
        self._ms = 0
        self._rest = b""
        self._speaking = False
        self._silence_ms = 0

    def listen(self, notify: Callable[[], None]) -> None:
        """Every event comes from ``feed``: nothing to announce later."""

    def expect_words(self) -> None:
        self.words.append("<expected>")

    def hear(self, words: str | None) -> None:
        """Judges by amplitude alone, but keeps what it was told (``words``), for tests of the session."""
        self.words.append(words)

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


class FakeBackend:
    """Answers every request with ``reply`` word by word, per choice (``n``), up to ``max_tokens``, with
    logprobs when asked: a TextDelta per word, or for spoken answers one 100 ms AudioChunk per word carrying
    it as its transcript; then Done per choice and the Usage. An image request gets, per image,
    ``partial_images`` previews (when ``preview_every`` asks for them) and a final PNG of the asked size.
    ``script`` (when set) is streamed verbatim instead; ``gate`` (when set) holds each stream before its
    first chunk until the test releases it; ``chunk_delay`` pauses before every chunk.

    Everything asked of it is recorded: ``requests``, ``aborted``; streams that ran to their end
    (``completed``) or were closed before it (``closed``); ``transcribed`` audio (with its
    ``transcription_options``), ``synthesized`` text and ``vad_settings``."""

    def __init__(
        self,
        reply: str = "hello from the fake model",
        *,
        transcript: str = "what the user said",
        vad: bool = True,
        audio_out: bool = True,
        image_out: bool = False,
        vision: bool = True,
        capabilities: Capabilities | None = None,
        script: list[OutputChunk] | None = None,
        chunk_delay: float = 0.0,
        fail_transcription: bool = False,
        partial_images: int = 2,
        healthy: bool = True,
        lora: bool = False,
    ) -> None:
        self.reply = reply
        self.transcript = transcript
        self.vad_enabled = vad
        self.script = script
        self.chunk_delay = chunk_delay
        self.fail_transcription = fail_transcription
        self.partial_images = partial_images
        self.healthy = healthy
        self.gate: asyncio.Event | None = None
        self.requests: list[OmniRequest] = []
        self.embedded: list[EmbeddingRequest] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.completed: list[str] = []
        self.transcribed: list[bytes] = []
        self.transcription_options: list[tuple[int, str | None]] = []  # (sample rate, language) of each
        self.synthesized: list[tuple[str, AudioOutputOptions]] = []
        self.vad_settings: list[VadSettings] = []
        self.vads: list[AmplitudeVad] = []
        self.capabilities = capabilities or Capabilities(
            model="omni-test",
            input_modalities=frozenset({"text", "audio"} | ({"image"} if vision else set())),
            output_modalities=frozenset(
                {"text"} | ({"audio"} if audio_out else set()) | ({"image"} if image_out else set())
            ),
            voices=("joe", "verse"),
            max_context_tokens=4096,
            serves_lora=lora,
        )
        self.adapters: dict[str, str] = {}  # LoRA adapters "loaded": a folder named "missing" is refused

    def reset(self) -> None:
        """Back to the defaults, for a server shared by several tests."""
        self.__init__()

    def chunks(self, request: OmniRequest) -> list[OutputChunk]:
        """What ``generate`` streams for ``request``."""
        if self.script is not None:
            return list(self.script)
        if "image" in request.modalities and not request.prefill_only:
            return self._images(request)
        words = words_of(self.reply)
        limit = request.sampling.max_tokens or len(words)
        spoken = "audio" in request.modalities and not request.prefill_only  # a prefill answers in text
        out: list[OutputChunk] = []
        for index in range(request.sampling.n):
            for text in words[:limit]:
                if spoken:  # spoken answers carry their text only as the audio's transcript
                    out.append(AudioChunk(tone(100), RATE, transcript=text))
                else:
                    lp = ((text, -0.5, ((text, -0.5), ("x", -2.0))),) if request.sampling.logprobs is not None else ()
                    out.append(TextDelta(text, index=index, logprobs=lp))
            out.append(Done("length" if limit < len(words) else "stop", index=index))
        emitted = min(limit, len(words)) * request.sampling.n
        prompt = len(request.raw_prompt.split()) if request.raw_prompt is not None else None
        usage = Usage(
            input_tokens=self.count_tokens(request.messages) if prompt is None else prompt,
            output_tokens=emitted,
            output_audio_tokens=emitted if spoken else 0,
        )
        return [*out, usage]

    def _images(self, request: OmniRequest) -> list[OutputChunk]:
        options = request.image
        previews = self.partial_images if options.preview_every else 0
        out: list[OutputChunk] = []
        for i in range(options.n):
            out += [ImagePartial(index=k, png=png(shade=k + 1), step=k + 1, image_index=i) for k in range(previews)]
            out.append(ImageFinal(png=png(*options.size), image_index=i, seed=options.seed))
        return [*out, Usage(input_tokens=self.count_tokens(request.messages)), Done("stop")]

    def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        self.requests.append(request)
        return self._stream(request)

    async def _stream(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        try:
            if self.gate is not None:
                await self.gate.wait()
            for chunk in self.chunks(request):
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                yield chunk
            self.completed.append(request.request_id)
        finally:
            if request.request_id not in self.completed:
                self.closed.append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def transcribe(
        self, pcm16: bytes, sample_rate: int, *, language: str | None = None, prompt: str | None = None
    ) -> Transcription:
        self.transcribed.append(pcm16)
        self.transcription_options.append((sample_rate, language))
        if self.fail_transcription:
            raise RuntimeError("ASR exploded")
        return Transcription(self.transcript, language=language or "en", duration_s=len(pcm16) / (2 * sample_rate))

    async def synthesize(self, text: str, options: AudioOutputOptions) -> AsyncIterator[AudioChunk]:
        self.synthesized.append((text, options))
        for word in words_of(text):
            yield AudioChunk(tone(100, rate=options.sample_rate), options.sample_rate, transcript=word)

    async def embed(self, request: EmbeddingRequest) -> Embeddings | Error:
        """An 8-dimensional unit vector per input, a function of its text (or token ids); one token per word
        (or id). ``script`` holding an ``Error`` answers with it instead."""
        self.embedded.append(request)
        if self.script and isinstance(self.script[0], Error):
            return self.script[0]
        vectors = []
        for item in request.inputs:
            seed = zlib.crc32(repr(item).encode())
            raw = [((seed >> (4 * k)) & 15) - 7.5 for k in range(8)]
            norm = math.sqrt(sum(x * x for x in raw))
            vectors.append(tuple(x / norm for x in raw))
        tokens = sum(len(i.split()) if isinstance(i, str) else len(i) for i in request.inputs)
        return Embeddings(tuple(vectors), tokens)

    def new_vad(self, settings: VadSettings) -> AmplitudeVad:
        if not self.vad_enabled:
            raise RuntimeError("VAD disabled")
        self.vad_settings.append(settings)
        self.vads.append(AmplitudeVad(settings))
        return self.vads[-1]

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """One token per word."""
        return sum(len(m.text.split()) for m in messages)

    def lora_adapters(self) -> dict[str, str]:
        return dict(self.adapters)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        if path.endswith("missing"):
            raise InvalidInput(f"LoRA adapter {name!r}: {path!r} is not a directory", param="lora_name")
        self.adapters[name] = path

    async def unload_lora_adapter(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise InvalidInput(f"LoRA adapter {name!r} is not loaded", param="lora_name")

    def health(self) -> Health:
        return Health(ok=self.healthy, detail="ready" if self.healthy else "engine thread stopped")

    def metrics(self) -> dict[str, float]:
        return {
            "requests": float(len(self.requests)),
            "kv_blocks_used": 3.0,
            "kv_blocks_free": 61.0,
            "requests_waiting": 0.0,
        }
