"""A scripted ``OmniBackend`` for the HTTP API tests, and a uvicorn server on a free loopback port."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    Capabilities,
    Done,
    Error,
    Health,
    ImageFinal,
    ImagePartial,
    Message,
    OmniRequest,
    OutputChunk,
    TextDelta,
    ToolCallDelta,
    Transcription,
    Usage,
    VadSettings,
)

PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d4944415478da63f8cfc0f01f0005000201e2b5f3a70000000049454e44ae426082"
)


def tone(n_samples: int, value: int = 1000) -> bytes:
    return struct.pack(f"<{n_samples}h", *([value] * n_samples))


@dataclass
class FakeBackend:
    """Answers every chat with ``reply`` split into words (one TextDelta each, per choice), reports usage,
    and records requests, aborts and closed streams so tests can assert on them."""

    reply: str = "hello from the fake model"
    caps: Capabilities = field(
        default_factory=lambda: Capabilities(
            model="omni-test",
            input_modalities=frozenset({"text", "audio", "image"}),
            output_modalities=frozenset({"text", "audio"}),
            voices=("joe", "amy"),
            max_context_tokens=64,
        )
    )
    script: list[OutputChunk] | None = None  # when set, yielded verbatim instead of the reply
    delay_s: float = 0.0  # pause before every chunk (disconnect tests)
    healthy: bool = True
    requests: list[OmniRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    transcribed: list[tuple[bytes, int, str | None]] = field(default_factory=list)
    synthesized: list[tuple[str, AudioOutputOptions]] = field(default_factory=list)

    def reset(self) -> None:
        """Back to the defaults, for a server shared by several tests."""
        self.__init__()

    @property
    def capabilities(self) -> Capabilities:
        return self.caps

    def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        self.requests.append(request)
        return self._stream(request)

    async def _stream(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        try:
            for chunk in self._chunks(request):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                yield chunk
            self.completed.append(request.request_id)
        finally:
            if request.request_id not in self.completed:
                self.closed.append(request.request_id)

    def _chunks(self, request: OmniRequest) -> list[OutputChunk]:
        if self.script is not None:
            return list(self.script)
        if "image" in request.modalities:
            opts = request.image
            out: list[OutputChunk] = []
            for i in range(opts.n):
                out += [
                    ImagePartial(index=k, png=PNG_1X1, step=k + 1, image_index=i)
                    for k in range(opts.preview_every and 2)
                ]
                out.append(ImageFinal(png=PNG_1X1, image_index=i, seed=opts.seed))
            return out + [Usage(input_tokens=3), Done("stop")]
        words = self.reply.split(" ")
        limit = request.sampling.max_tokens or len(words)
        prompt = self.count_tokens(request.messages) if request.raw_prompt is None else len(request.raw_prompt.split())
        out = []
        for index in range(request.sampling.n):
            for k, word in enumerate(words[:limit]):
                text = word if k == 0 else " " + word
                lp = ((text, -0.5, ((text, -0.5), ("x", -2.0))),) if request.sampling.logprobs is not None else ()
                if "audio" in request.modalities:  # spoken answers: text only as the audio's transcript
                    out.append(AudioChunk(pcm16=tone(240), sample_rate=24000, transcript=text))
                else:
                    out.append(TextDelta(text=text, index=index, logprobs=lp))
            out.append(Done("length" if limit < len(words) else "stop", index=index))
        emitted = min(limit, len(words)) * request.sampling.n
        return out + [Usage(input_tokens=prompt, output_tokens=emitted)]

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def transcribe(
        self, pcm16: bytes, sample_rate: int, *, language: str | None = None, prompt: str | None = None
    ) -> Transcription:
        self.transcribed.append((pcm16, sample_rate, language))
        return Transcription(
            text=f"{len(pcm16) // 2} samples at {sample_rate} Hz",
            language=language or "en",
            duration_s=len(pcm16) / 2 / sample_rate,
        )

    async def synthesize(self, text: str, options: AudioOutputOptions) -> AsyncIterator[AudioChunk]:
        self.synthesized.append((text, options))
        for word in text.split():
            yield AudioChunk(pcm16=tone(100), sample_rate=options.sample_rate, transcript=word)

    def new_vad(self, settings: VadSettings):
        raise NotImplementedError("the HTTP API never asks for a VAD")

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        return sum(len(m.text.split()) + 2 for m in messages)

    def health(self) -> Health:
        return Health(ok=self.healthy, detail="ready" if self.healthy else "engine thread stopped")

    def metrics(self) -> dict[str, float]:
        return {"kv_blocks_used": 3.0, "kv_blocks_free": 61.0, "requests_waiting": 0.0}


def overloaded(status: int = 503) -> list[OutputChunk]:
    return [Error(code="overloaded", message="the engine queue is full; retry later", status=status), Done("error")]


def tool_call_script() -> list[OutputChunk]:
    return [
        ToolCallDelta(call_id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
        Done("stop"),
        Usage(input_tokens=5, output_tokens=7),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(app) -> str:
    """Serve ``app`` on 127.0.0.1 in a background thread; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def http_app(backend: FakeBackend, api_key: str | None = None, limits: HttpLimits | None = None):
    """The gateway's real application (realtime route included) around ``backend``."""
    return create_app(backend, GatewayConfig(api_key=api_key, http=limits or HttpLimits()))


@contextmanager
def served(backend: FakeBackend, api_key: str | None = None, limits: HttpLimits | None = None):
    """``(base_url, openai.OpenAI client)`` for ``backend`` behind a live server."""
    import openai

    with serve(http_app(backend, api_key, limits)) as url:
        yield url, openai.OpenAI(base_url=f"{url}/v1", api_key=api_key or "unused", max_retries=0, timeout=20)
