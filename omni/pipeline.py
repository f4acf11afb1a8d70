"""OmniPipeline: the model side of the gateway (``omni.protocol.OmniBackend``).

One turn: audio parts without a transcript go through ASR; the conversation is rendered with the
LLM's chat template and streamed from the engine thread; for audio output the text deltas feed the
TTS head, which speaks clause by clause while the text is still being generated; image output goes
to the DiT head. Every stage stops when the consumer closes the stream or calls ``abort``.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from omni_gateway.engine.errors import EngineDead, EngineOverloaded, InvalidRequest
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.heads.dit_errors import ImageGenerationError
from omni_gateway.omni.media import MediaError, server_budget
from omni_gateway.omni.prompting import SamplingDefaults, UnsupportedInput, chat_messages, sampling_params
from omni_gateway.omni.protocol import (AudioChunk, AudioOutputOptions, AudioPart, Capabilities, Done, Error, Health, ImagePart,
                           Message, OmniRequest, OutputChunk, TextDelta, TextPart, ToolCallDelta, Transcription, Usage,
                           VadEvent, VadSettings, VideoPart, VoiceActivityDetector)
from omni_gateway.omni.tool_calls import parse_tool_calls

log = logging.getLogger(__name__)

_WARM_UP_SENTENCE = "Hello, this sentence only warms up the voice before anyone hears it."
# Fast English speech is ~3 words/s, ~4 tokens/s; count more so the estimate stays an upper bound.
_SPEECH_TOKENS_PER_SECOND = 8


class OmniPipeline:
    def __init__(self, config: OmniConfig, *, engine: Any, model_name: str, max_context_tokens: int,
                 asr: Any | None = None, tts: Any | None = None, vad_session: Any | None = None,
                 image_head: Any | None = None, vision: Any | None = None) -> None:
        self.config = config
        self.engine = engine  # engine.async_engine.AsyncEngine or anything with its interface
        self.asr = asr
        self.tts = tts
        self.image_head = image_head
        self.vision = vision  # encoders.vision.VisionEncoder of a vision-language checkpoint
        self.media_budget = server_budget()  # decoded pixels every request together may hold (omni.media)
        self._vad_session = vad_session
        self._defaults = SamplingDefaults(temperature=config.temperature, top_p=config.top_p,
                                          max_tokens=config.max_tokens)
        self._asr_lock = threading.Lock()  # one decoder instance; turns are short and sequential anyway
        self._active: dict[str, asyncio.Event] = {}
        inputs = {"text"} | ({"audio"} if asr is not None else set()) | ({"image", "video"} if vision else set())
        outputs = {"text"} | ({"audio"} if tts is not None else set()) | ({"image"} if image_head is not None else set())
        self.capabilities = Capabilities(
            model=config.served_model_name or model_name,
            input_modalities=frozenset(inputs),
            output_modalities=frozenset(outputs),
            voices=tuple(tts.voices) if tts is not None else (),
            max_context_tokens=max_context_tokens,
        )

    @classmethod
    def load(cls, config: OmniConfig) -> OmniPipeline:
        """Load every configured stage; the slow ones report progress on the log."""
        from omni_gateway.engine.async_engine import AsyncEngine

        t0 = time.monotonic()
        threads = stage_threads(config)
        if _engine_on_cpu(config):
            import torch

            torch.set_num_threads(threads)  # before the engine thread starts, so it runs with this count
        engine = AsyncEngine(config.engine)
        model_name = engine.model_name
        log.info("LLM %s ready in %.1f s", model_name, time.monotonic() - t0)
        asr = tts = vad_session = image_head = vision = None
        try:
            from omni_gateway.encoders.vision import checkpoint_family
            if config.vision and checkpoint_family(config.engine.model):
                from omni_gateway.encoders.vision import load_vision_encoder
                runner = engine.engine.runner
                vision = load_vision_encoder(config.engine.model, device=runner.device, dtype=runner.dtype)
                log.info("vision tower of %s ready", config.engine.model)
            if config.asr is not None:
                from omni_gateway.encoders.asr import load_recognizer
                asr = load_recognizer(config.asr, device=config.device)
                log.info("ASR %s ready", config.asr)
            if config.tts is not None:
                from omni_gateway.omni.heads.tts import TtsHead
                tts = TtsHead.load(config.tts, device=config.device, threads=threads)
                log.info("TTS %s ready", config.tts)
            if config.vad:
                from omni_gateway.encoders.vad import load_session
                vad_session = load_session()
            if config.image_model is not None:
                from omni_gateway.omni.heads.dit import load_image_head
                image_head = load_image_head(config.image_model, device=config.device)
                log.info("image model %s ready", config.image_model)
        except BaseException:
            engine.shutdown()
            raise
        pipeline = cls(config, engine=engine, model_name=model_name, max_context_tokens=engine.max_model_len,
                       asr=asr, tts=tts, vad_session=vad_session, image_head=image_head, vision=vision)
        if config.warm_up:
            try:
                pipeline.warm_up()
            except BaseException:
                pipeline.shutdown()
                raise
        log.info("all stages ready in %.1f s", time.monotonic() - t0)
        return pipeline

    def warm_up(self) -> None:
        """One short pass through the LLM, ASR and TTS. The LLM's prompt starts as every conversation's
        does (system prompt included), so those full KV blocks stay in the prefix cache for later turns."""
        from concurrent.futures import ThreadPoolExecutor

        from omni_gateway.engine.sampling_params import SamplingParams

        ids = self._prompt_ids(OmniRequest(request_id="warm-up", messages=(Message("user", (TextPart("Hello."),)),)))

        async def a_few_tokens() -> None:  # prefill and decode steps both pay their first-call costs here
            async for _ in self.engine.generate(ids, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                                                request_id="warm-up"):
                pass

        with ThreadPoolExecutor(1) as pool:  # its own event loop: load() may be called from inside one
            pool.submit(asyncio.run, a_few_tokens()).result()
        if self.asr is not None:
            self.asr.transcribe(bytes(16000), sample_rate=16000)  # 0.5 s of silence
        if self.tts is not None:
            # Longer than a first segment: the voice model's buffers grow once, here, to fit those too.
            self.tts.synthesize(_WARM_UP_SENTENCE)

    # ---- OmniBackend -----------------------------------------------------------------------------

    async def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        cancel = asyncio.Event()
        self._active[request.request_id] = cancel
        try:
            if "image" not in request.modalities:
                stream = self._respond(request, cancel)
            elif request.modalities == ("image",):
                stream = self._generate_image(request, cancel)
            else:
                # Text or speech about the picture while it is drawn: both stages run side by side.
                words = dataclasses.replace(request, modalities=tuple(m for m in request.modalities if m != "image"))
                stream = _merged(self._respond(words, cancel), self._generate_image(request, cancel))
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._active.pop(request.request_id, None)

    async def _respond(self, request: OmniRequest, cancel: asyncio.Event) -> AsyncIterator[OutputChunk]:
        """The LLM's answer, as text or (with "audio") speech."""
        try:
            request = await self._transcribe_parts(request)
            prompt = await self._prompt(request)
            params = sampling_params(request.sampling, self._defaults)
        except (InvalidRequest, UnsupportedInput, ValueError) as exc:
            yield _error(exc)
            return
        if "audio" in request.modalities:
            stream = self._spoken(request, prompt, params, cancel)
        else:
            stream = self._written(request, prompt, params)
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                yield chunk

    async def abort(self, request_id: str) -> None:
        event = self._active.get(request_id)
        if event is not None:
            event.set()
        self.engine.abort(request_id)

    async def transcribe(self, pcm16: bytes, sample_rate: int, *, language: str | None = None,
                         prompt: str | None = None) -> Transcription:
        if self.asr is None:
            raise UnsupportedInput("no speech recognition model is loaded (start the server with --asr)")
        result = await asyncio.to_thread(self._transcribe_locked, pcm16, sample_rate, language, prompt)
        return Transcription(text=result.text, language=result.language, duration_s=result.duration_s)

    def _transcribe_locked(self, pcm16: bytes, sample_rate: int, language: str | None, prompt: str | None) -> Any:
        with self._asr_lock:
            return self.asr.transcribe(pcm16, sample_rate=sample_rate, language=language, prompt=prompt)

    async def synthesize(self, text: str, options: AudioOutputOptions) -> AsyncIterator[AudioChunk]:
        if self.tts is None:
            raise UnsupportedInput("no speech synthesis model is loaded (start the server with --tts)")

        async def once() -> AsyncIterator[str]:
            yield text

        async for chunk in self.tts.stream(once(), options):
            yield chunk

    def new_vad(self, settings: VadSettings) -> VoiceActivityDetector:
        if self._vad_session is None:
            raise UnsupportedInput("voice activity detection is disabled on this server")
        from omni_gateway.encoders.vad import SileroVad

        return _SileroDetector(SileroVad(threshold=settings.threshold, prefix_padding_ms=settings.prefix_padding_ms,
                                         silence_duration_ms=settings.silence_duration_ms, session=self._vad_session))

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """Prompt tokens of a conversation. Audio not yet transcribed counts by its duration, at a rate
        above what speech produces, so a size check made before ASR never lets a too-long prompt through.
        Image and video tokens are not counted here: the engine checks the expanded prompt's length."""
        estimate = 0
        counted = []
        for message in messages:
            parts = []
            for part in message.parts:
                if isinstance(part, AudioPart) and part.transcript is None:
                    seconds = len(part.pcm16) / 2 / part.sample_rate if part.sample_rate else 0.0
                    if getattr(part, "encoded", None):
                        seconds = len(part.encoded) / 4000  # ~32 kbit/s: a low bitrate for speech, an upper bound
                    estimate += int(seconds * _SPEECH_TOKENS_PER_SECOND) + 1
                    part = dataclasses.replace(part, transcript="")
                if isinstance(part, (ImagePart, VideoPart)):
                    continue
                parts.append(part)
            counted.append(dataclasses.replace(message, parts=tuple(parts)))
        return len(self._prompt_ids(OmniRequest(request_id="count", messages=tuple(counted)))) + estimate

    def health(self) -> Health:
        state = self.engine.health()
        if state["alive"]:
            return Health(ok=True, detail=f"engine loop running, {state['open_streams']} open streams")
        return Health(ok=False, detail=f"engine loop stopped: {state['error']}")

    def metrics(self) -> dict[str, float]:
        return dict(self.engine.stats())

    def shutdown(self) -> None:
        if self.image_head is not None:
            self.image_head.close()
        self.engine.shutdown()

    # ---- stages ----------------------------------------------------------------------------------

    async def _transcribe_parts(self, request: OmniRequest) -> OmniRequest:
        """Give every audio part a transcript (HTTP input_audio parts arrive without one)."""
        if not any(isinstance(p, AudioPart) and p.transcript is None for m in request.messages for p in m.parts):
            return request
        messages = []
        for message in request.messages:
            parts = []
            for part in message.parts:
                if isinstance(part, AudioPart) and part.transcript is None:
                    pcm16, rate = self._pcm16_of(part)
                    text = (await self.transcribe(pcm16, rate)).text
                    part = AudioPart(pcm16=pcm16, sample_rate=rate, transcript=text)
                parts.append(part)
            messages.append(Message(message.role, tuple(parts), message.tool_calls, message.tool_call_id))
        return dataclasses.replace(request, messages=tuple(messages))

    @staticmethod
    def _pcm16_of(part: AudioPart) -> tuple[bytes, int]:
        encoded = getattr(part, "encoded", None)
        if encoded:
            from omni_gateway.encoders.audio import decode_audio, float_to_pcm16

            decoded = decode_audio(encoded)
            return float_to_pcm16(decoded.samples), decoded.sample_rate
        return part.pcm16, part.sample_rate

    def _prompt_ids(self, request: OmniRequest) -> list[int]:
        tokenizer = self.engine.tokenizer
        if request.raw_prompt is not None:
            return list(tokenizer.encode(request.raw_prompt))
        messages = chat_messages(request, allow_images=False)
        if self.config.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        prompt = self.engine.render_chat(messages, tools=request.tools or None,
                                         add_generation_prompt=request.add_generation_prompt)
        # The template already holds the special tokens (BOS, role markers); don't add them twice.
        return list(tokenizer.encode(prompt, add_special_tokens=False))

    async def _prompt(self, request: OmniRequest) -> _Prompt:
        if self.vision is None or not _has_media(request):
            return _Prompt(self._prompt_ids(request))
        from omni_gateway.omni.vision import build_vision_prompt_async

        built = await build_vision_prompt_async(request, self.engine.tokenizer, self.vision, self.media_budget,
                                                system_prompt=self.config.system_prompt)
        return _Prompt(built.token_ids, built.embed_spans, built.num_image_tokens)

    async def _deltas(self, request: OmniRequest, prompt: _Prompt, params: Any) -> AsyncIterator[StreamDelta]:
        kwargs = {"embed_spans": prompt.embed_spans} if prompt.embed_spans else {}
        async with contextlib.aclosing(self.engine.generate(prompt.token_ids, params, request_id=request.request_id,
                                                            priority=request.priority, **kwargs)) as deltas:
            async for delta in deltas:
                yield delta

    async def _written(self, request: OmniRequest, prompt: _Prompt, params: Any) -> AsyncIterator[OutputChunk]:
        tool_names = frozenset(t.get("name") or t.get("function", {}).get("name") for t in request.tools)
        held: dict[int, list[str]] = {}  # with tools, text is held until we know whether it is a call
        finals: list[StreamDelta] = []
        try:
            async for delta in self._deltas(request, prompt, params):
                if delta.error is not None:
                    yield Error("engine_error", delta.error, status=500)
                    return
                if delta.text or delta.logprobs:
                    if tool_names:
                        held.setdefault(delta.index, []).append(delta.text)
                    else:
                        yield TextDelta(delta.text, index=delta.index, logprobs=self._logprobs(delta))
                if delta.finished:
                    finals.append(delta)
                    reason = delta.finish_reason or "stop"
                    if tool_names:
                        content, calls = parse_tool_calls("".join(held.pop(delta.index, [])), tool_names)
                        if content:
                            yield TextDelta(content, index=delta.index)
                        for call in calls:
                            yield ToolCallDelta(call.call_id, call.name, call.arguments)
                        if calls:
                            reason = "tool_calls"
                    yield Done(reason, index=delta.index)
        except (InvalidRequest, EngineOverloaded, EngineDead) as exc:
            yield _error(exc)
            return
        yield _usage(finals, prompt)

    async def _spoken(self, request: OmniRequest, prompt: _Prompt, params: Any,
                      cancel: asyncio.Event) -> AsyncIterator[OutputChunk]:
        if self.tts is None:
            yield Error("unsupported_modality", "audio output needs a speech synthesis model (start with --tts)")
            return
        finals: list[StreamDelta] = []
        failure: list[Error] = []

        async def text() -> AsyncIterator[str]:
            try:
                async for delta in self._deltas(request, prompt, params):
                    if delta.error is not None:
                        failure.append(Error("engine_error", delta.error, status=500))
                        return
                    if delta.index != 0:
                        continue  # one voice per response: extra choices are not spoken
                    if delta.text:
                        yield delta.text
                    if delta.finished:
                        finals.append(delta)
                    if cancel.is_set():
                        return
            except (InvalidRequest, EngineOverloaded, EngineDead) as exc:
                failure.append(_error(exc))

        samples = 0
        async for chunk in self.tts.stream(text(), request.audio):
            if cancel.is_set():
                break
            samples += len(chunk.pcm16) // 2
            yield chunk
        if failure:
            yield failure[0]
            return
        reason = finals[0].finish_reason if finals else "abort"
        yield Done(reason or "stop")
        # Output audio tokens are counted as OpenAI does for its realtime models: 1 token per 50 ms.
        usage = _usage(finals, prompt)
        yield dataclasses.replace(usage, output_audio_tokens=round(samples / request.audio.sample_rate * 20))

    async def _generate_image(self, request: OmniRequest, cancel: asyncio.Event) -> AsyncIterator[OutputChunk]:
        if self.image_head is None:
            yield Error("unsupported_modality", "image output needs an image model (start with --image-model DIR)")
            return
        prompt = "\n".join(m.text for m in request.messages if m.role == "user").strip()
        if not prompt:
            yield Error("invalid_request", "image generation needs a text prompt in a user message")
            return
        try:
            async for chunk in self.image_head.generate(prompt, request.image, cancel):
                yield chunk
        except ImageGenerationError as exc:
            log.exception("image generation failed")
            yield Error("image_generation_failed", str(exc), status=500)
            return
        except ValueError as exc:
            yield _error(exc)
            return
        yield Done("abort" if cancel.is_set() else "stop")

    def _logprobs(self, delta: StreamDelta) -> tuple[tuple[str, float, tuple[tuple[str, float], ...]], ...]:
        if not delta.logprobs:
            return ()
        tok = self.engine.tokenizer
        return tuple((tok.decode([lp.token_id]), lp.logprob,
                      tuple((tok.decode([t]), v) for t, v in lp.top)) for lp in delta.logprobs)


def stage_threads(config: OmniConfig) -> int:
    """CPU threads for each model stage: the configured count, else half the cores (at least one)."""
    if config.stage_threads is not None:
        if config.stage_threads < 1:
            raise ValueError(f"stage_threads must be >= 1; got {config.stage_threads}")
        return config.stage_threads
    return max(1, (os.cpu_count() or 1) // 2)


def _engine_on_cpu(config: OmniConfig) -> bool:
    device = config.engine.device
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"


_STREAM_END = object()


async def _merged(*streams: AsyncIterator[OutputChunk]) -> AsyncIterator[OutputChunk]:
    """Chunks of several streams as they come. A small queue keeps each producer at the consumer's pace;
    closing the merged stream closes every source."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=8)

    async def pump(stream: AsyncIterator[OutputChunk]) -> None:
        try:
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    await queue.put(chunk)
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put(exc)
            return
        await queue.put(_STREAM_END)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _STREAM_END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _SileroDetector:
    """``VoiceActivityDetector`` of the protocol over the encoders' detector (which knows nothing of omni)."""

    def __init__(self, detector: Any) -> None:
        self._detector = detector

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        return [VadEvent(event.kind, event.audio_ms) for event in self._detector.feed(pcm16)]

    def reset(self) -> None:
        self._detector.reset()


@dataclasses.dataclass(frozen=True, slots=True)
class _Prompt:
    token_ids: list[int]
    embed_spans: tuple[Any, ...] = ()  # engine.sequence.EmbedSpan for image/video placeholders
    num_image_tokens: int = 0


def _has_media(request: OmniRequest) -> bool:
    return any(isinstance(p, (ImagePart, VideoPart)) for m in request.messages for p in m.parts)


def _usage(finals: list[StreamDelta], prompt: _Prompt) -> Usage:
    if not finals:
        return Usage(input_image_tokens=prompt.num_image_tokens)
    return Usage(input_tokens=finals[0].num_prompt_tokens, cached_tokens=finals[0].num_cached_tokens,
                 output_tokens=sum(d.num_output_tokens for d in finals), input_image_tokens=prompt.num_image_tokens)


def _error(exc: Exception) -> Error:
    if isinstance(exc, EngineOverloaded):
        return Error("overloaded", str(exc), status=503)
    if isinstance(exc, EngineDead):
        return Error("engine_dead", str(exc), status=503)
    if isinstance(exc, UnsupportedInput):
        return Error("unsupported_modality", str(exc), status=400)
    if isinstance(exc, MediaError):
        return Error(exc.code, str(exc), status=exc.status)
    return Error("invalid_request", str(exc), status=400)

