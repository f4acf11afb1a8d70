"""OmniPipeline: the model side of the gateway (``omni.protocol.OmniBackend``).

One turn: audio parts without a transcript go through ASR, unless the model hears audio itself (its
audio tower turns them into embeddings, ``omni.audio_input``); the conversation is rendered with the
LLM's chat template and streamed from the engine thread; for audio output the text deltas feed the
TTS head, which speaks clause by clause while the text is still being generated; image output goes
to the DiT head. Every stage stops when the consumer closes the stream or calls ``abort``.

This module is the facade; loading and warm-up live in ``omni.loading``, the prompt renderer in
``omni.prompting``, the output streams in ``omni.streams``, and what each model must offer in
``omni.collaborators``. Only ``InvalidInput`` is the client's fault; any other exception propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from omni_gateway.omni.collaborators import (
    Engine,
    ImageHead,
    Recognizer,
    SpeechDetector,
    SpeechHead,
    Transcript,
    TurnDetector,
    VadModel,
)
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.embedding import embed
from omni_gateway.omni.loading import close_voice, load_pipeline, warm_up
from omni_gateway.omni.media import server_budget
from omni_gateway.omni.prompting import (
    SamplingDefaults,
    UnsupportedInput,
    prompt_ids,
    sampling_params,
    structured_outputs,
)
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    AudioPart,
    Capabilities,
    EmbeddingRequest,
    Embeddings,
    Error,
    Health,
    ImagePart,
    InvalidInput,
    Message,
    OmniRequest,
    OutputChunk,
    Transcription,
    VadEvent,
    VadSettings,
    VideoPart,
    VoiceActivityDetector,
)
from omni_gateway.omni.streams import Prompt, drawn, merged, refusal, spoken, written
from omni_gateway.omni.tools import tool_call_format

if TYPE_CHECKING:
    from omni_gateway.encoders.audio_tower import AudioEncoder
    from omni_gateway.encoders.vad import VadBatcher
    from omni_gateway.encoders.vision import VisionEncoder
    from omni_gateway.omni.qwen3_speech import Qwen3SpokenModel
    from omni_gateway.omni.speech import SpokenModel

log = logging.getLogger(__name__)

# Fast English speech is ~3 words/s, ~4 tokens/s; count more so the estimate stays an upper bound.
_SPEECH_TOKENS_PER_SECOND = 8
# A model that hears takes 25 audio tokens per second (Qwen2-Audio, Qwen2.5-Omni; Voxtral 12.5), plus its markers.
_HEARD_TOKENS_PER_SECOND = 26


class OmniPipeline:
    def __init__(
        self,
        config: OmniConfig,
        *,
        engine: Engine,
        model_name: str,
        max_context_tokens: int,
        asr: Recognizer | None = None,
        tts: SpeechHead | None = None,
        vad_session: VadModel | None = None,
        image_head: ImageHead | None = None,
        vision: VisionEncoder | None = None,
        audio: AudioEncoder | None = None,
        speech: SpokenModel | Qwen3SpokenModel | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.asr = asr
        self.tts = tts
        self.image_head = image_head
        self.vision = vision  # the vision tower of a vision-language checkpoint
        self.audio = audio  # the audio tower of a checkpoint that hears (Qwen2-Audio, Voxtral, Qwen2.5-Omni)
        self.speech = speech  # a speaking model's talker and token2wav: audio in the model's own voice
        self.media_budget = server_budget()  # decoded pixels every request together may hold (omni.media)
        self._vad_session = vad_session
        self._vad_batcher: VadBatcher | None = None  # started by the first server_vad session
        self._defaults = SamplingDefaults(
            temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens
        )
        self.tool_calls = tool_call_format(config.tool_call_parser)
        self._asr_lock = threading.Lock()  # one decoder instance; turns are short and sequential anyway
        self._active: dict[str, asyncio.Event] = {}
        hears = audio is not None
        seen = {"image", "video"} if vision is not None else set()
        inputs = {"text"} | ({"audio"} if asr is not None or hears else set()) | seen
        speaks = tts is not None or speech is not None
        outputs = {"text"} | ({"audio"} if speaks else set()) | ({"image"} if image_head is not None else set())
        self.capabilities = Capabilities(
            model=config.served_model_name or model_name,
            input_modalities=frozenset(inputs),
            output_modalities=frozenset(outputs),
            voices=tuple(speech.voices) if speech is not None else tuple(tts.voices) if tts is not None else (),
            max_context_tokens=max_context_tokens,
            hears_audio=hears,
            hears_while_spoken=audio is not None and audio.chunk_stable,
            serves_lora=config.engine.enable_lora,
        )

    @classmethod
    def load(cls, config: OmniConfig) -> OmniPipeline:
        """Load every configured stage (``omni.loading``)."""
        return load_pipeline(config)

    def warm_up(self) -> None:
        """One short pass through every loaded stage (``omni.loading.warm_up``)."""
        warm_up(self)

    # ---- OmniBackend -----------------------------------------------------------------------------

    async def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        cancel = asyncio.Event()
        self._active[request.request_id] = cancel
        try:
            if "image" not in request.modalities or request.prefill_only:
                stream = self._respond(request, cancel)
            elif request.modalities == ("image",):
                stream = drawn(self.image_head, request, cancel)
            else:
                # Text or speech about the picture while it is drawn: both stages run side by side.
                words = dataclasses.replace(request, modalities=tuple(m for m in request.modalities if m != "image"))
                stream = merged(self._respond(words, cancel), drawn(self.image_head, request, cancel))
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._active.pop(request.request_id, None)

    async def _respond(self, request: OmniRequest, cancel: asyncio.Event) -> AsyncIterator[OutputChunk]:
        """The LLM's answer, as text or (with "audio") speech."""
        try:
            if self.audio is None:  # a model that hears takes the audio itself, not its transcript
                request = await self._transcribe_parts(request)
            if request.tools and request.tool_choice == "auto" and not self.config.auto_tool_choice:
                raise InvalidInput(
                    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                    param="tool_choice",
                )
            prompt = await self._prompt(request)
            constraint = structured_outputs(request, self.tool_calls)
            params = sampling_params(request.sampling, self._defaults, structured_outputs=constraint)
            if request.model is not None and request.model != self.capabilities.model:
                params = dataclasses.replace(params, lora_name=request.model)  # an adapter's name (engine.lora)
        except InvalidInput as exc:
            yield refusal(exc)
            return
        if request.prefill_only:
            if "audio" in request.modalities and self.speech is not None:
                params = self.speech.thinker_params(params)  # its blocks keep the rows the spoken reply asks
            text = dataclasses.replace(request, modalities=("text",))
            stream = written(self.engine, text, prompt, dataclasses.replace(params, max_tokens=1), self.tool_calls)
        elif "audio" in request.modalities and self.speech is not None:
            stream = self.speech.speak(self.engine, request, prompt, params, cancel)
        elif "audio" in request.modalities:
            stream = spoken(self.engine, self.tts, request, prompt, params, cancel, self.tool_calls)
        else:
            stream = written(self.engine, request, prompt, params, self.tool_calls)
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                yield chunk

    async def embed(self, request: EmbeddingRequest) -> Embeddings | Error:
        return await embed(self.engine, request)

    async def abort(self, request_id: str) -> None:
        event = self._active.get(request_id)
        if event is not None:
            event.set()
        self.engine.abort(request_id)
        if self.speech is not None:
            self.speech.abort(request_id)

    async def transcribe(
        self, pcm16: bytes, sample_rate: int, *, language: str | None = None, prompt: str | None = None
    ) -> Transcription:
        if self.asr is None:
            raise UnsupportedInput("no speech recognition model is loaded (start the server with --asr)")
        enqueue = getattr(self.asr, "enqueue", None)
        if enqueue is not None:  # a batching recognizer: concurrent turns share its batches
            # Converting the audio (decode, resample: 25 ms a minute of it) runs off the event loop; a caller
            # that leaves meanwhile has queued nothing.
            prepared = await asyncio.to_thread(
                self.asr.prepare, pcm16, sample_rate=sample_rate, language=language, prompt=prompt
            )
            job = enqueue(prepared)
            result = await asyncio.wrap_future(job)
        else:
            dropped = threading.Event()
            try:
                result = await asyncio.to_thread(self._transcribe_locked, pcm16, sample_rate, language, prompt, dropped)
            except asyncio.CancelledError:
                dropped.set()  # still waiting for the recognizer: it never starts (the thread cannot be stopped)
                raise
            assert result is not None  # only a dropped call has none
        return Transcription(text=result.text, language=result.language, duration_s=result.duration_s)

    def _transcribe_locked(
        self, pcm16: bytes, sample_rate: int, language: str | None, prompt: str | None, dropped: threading.Event
    ) -> Transcript | None:
        """One transcription at a time; one whose caller left while it waited (a speculation dropped because
        the speaker went on) is skipped, so it holds up none of the turns queued behind it."""
        assert self.asr is not None  # transcribe() checked
        with self._asr_lock:
            if dropped.is_set():
                return None
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
        from omni_gateway.encoders.vad import SileroVad, VadBatcher

        # every session's windows judged together, off the event loop
        if self._vad_batcher is None:
            self._vad_batcher = VadBatcher(self._vad_session)
        if settings.eagerness is None:
            batched = SileroVad(
                threshold=settings.threshold,
                prefix_padding_ms=settings.prefix_padding_ms,
                silence_duration_ms=settings.silence_duration_ms,
                batcher=self._vad_batcher,
            )
            return _SileroDetector(batched)
        from omni_gateway.encoders.turn import (
            EAGERNESS,
            PACKAGE,
            SemanticTurn,
            default_model_path,
            load_smart_turn,
            scoring_pool,
        )

        policy = EAGERNESS[settings.eagerness]
        # silero's own stop is the cap of a turn that sounds unfinished
        vad = SileroVad(
            threshold=settings.threshold,
            prefix_padding_ms=settings.prefix_padding_ms,
            silence_duration_ms=policy.max_silence_ms,
            batcher=self._vad_batcher,
        )

        try:
            default_model_path()
        except FileNotFoundError as exc:
            log.warning("%s", exc)
            raise UnsupportedInput(
                "semantic_vad needs the Smart Turn v3 model of the pipecat-ai package, which this server lacks "
                f"(pip install --no-deps {PACKAGE}); use server_vad"
            ) from None
        scoring_pool().submit(load_smart_turn)  # loaded by the first pause, off the event loop
        return _SemanticDetector(SemanticTurn(vad, policy))

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """Prompt tokens of a conversation. Audio not yet transcribed counts by its duration, at a rate
        above what speech produces, so a size check made before ASR never lets a too-long prompt through.
        Image and video tokens are not counted here: the engine checks the expanded prompt's length."""
        estimate = 0
        counted = []
        for message in messages:
            parts = []
            for part in message.parts:
                if isinstance(part, AudioPart) and (part.transcript is None or self.audio is not None):
                    seconds = len(part.pcm16) / 2 / part.sample_rate if part.sample_rate else 0.0
                    if getattr(part, "encoded", None):
                        seconds = len(part.encoded) / 4000  # ~32 kbit/s: a low bitrate for speech, an upper bound
                    rate = _SPEECH_TOKENS_PER_SECOND if self.audio is None else _HEARD_TOKENS_PER_SECOND
                    estimate += int(seconds * rate) + 3
                    part = dataclasses.replace(part, transcript="")
                if isinstance(part, (ImagePart, VideoPart)):
                    continue
                parts.append(part)
            counted.append(dataclasses.replace(message, parts=tuple(parts)))
        return len(self.prompt_ids(OmniRequest(request_id="count", messages=tuple(counted)))) + estimate

    def health(self) -> Health:
        state = self.engine.health()
        if state["alive"]:
            return Health(ok=True, detail=f"engine loop running, {state['open_streams']} open streams")
        return Health(ok=False, detail=f"engine loop stopped: {state['error']}")

    def metrics(self) -> dict[str, float]:
        return dict(self.engine.stats())

    def lora_adapters(self) -> dict[str, str]:
        listed = getattr(self.engine, "lora_adapters", None)
        return listed() if listed is not None and self.capabilities.serves_lora else {}

    async def load_lora_adapter(self, name: str, path: str) -> None:
        await self._lora_call("load_lora", name, path)

    async def unload_lora_adapter(self, name: str) -> None:
        await self._lora_call("unload_lora", name)

    async def _lora_call(self, method: str, *args: str) -> None:
        call = getattr(self.engine, method, None)
        if call is None or not self.capabilities.serves_lora:
            raise InvalidInput("LoRA adapters are not enabled on this server (start it with --enable-lora)")
        try:
            await call(*args)
        except ValueError as exc:  # the engine's InvalidRequest: a refused adapter or an unknown name
            raise InvalidInput(str(exc), param="lora_name") from exc

    def shutdown(self) -> None:
        if self.speech is not None:
            self.speech.shutdown()
        if self.image_head is not None:
            self.image_head.close()
        close_voice(self.asr, self.tts)
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
            from omni_gateway.encoders.audio import AudioDecodeError, decode_audio, float_to_pcm16

            try:
                decoded = decode_audio(encoded)
            except AudioDecodeError as exc:  # the client's upload: undecodable or over a limit
                raise InvalidInput(f"an input_audio part was refused: {exc}") from None
            return float_to_pcm16(decoded.samples), decoded.sample_rate
        return part.pcm16, part.sample_rate

    def prompt_ids(self, request: OmniRequest) -> list[int]:
        """The prompt of a conversation without media, rendered with the model's chat template."""
        return prompt_ids(
            request, self.engine.tokenizer, self.engine.render_chat, system_prompt=self.config.system_prompt
        )

    async def _prompt(self, request: OmniRequest) -> Prompt:
        if self.audio is not None and _has_audio(request):
            from omni_gateway.omni.audio_input import build_audio_prompt_async

            # Media decoding and the towers are heavy: a worker thread runs them, within the pixel budget.
            built = await build_audio_prompt_async(
                request,
                self.engine.tokenizer,
                self.audio,
                self.vision,
                self.media_budget,
                system_prompt=self.config.system_prompt,
                render=self.engine.render_chat,
            )
            return Prompt(built.token_ids, built.embed_spans, built.num_image_tokens, built.num_audio_tokens)
        if self.vision is None or not _has_media(request):
            return Prompt(self.prompt_ids(request))
        from omni_gateway.omni.vision import build_vision_prompt_async

        # Media decoding and the vision tower are heavy: they run in worker threads, within the pixel budget.
        built = await build_vision_prompt_async(
            request,
            self.engine.tokenizer,
            self.vision,
            self.media_budget,
            system_prompt=self.config.system_prompt,
            render=self.engine.render_chat,
        )
        return Prompt(built.token_ids, built.embed_spans, built.num_image_tokens)


class _SileroDetector:
    """``VoiceActivityDetector`` of the protocol over the encoders' detector (which knows nothing of omni)."""

    def __init__(self, detector: SpeechDetector) -> None:
        self._detector = detector

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        return [VadEvent(event.kind, event.audio_ms) for event in self._detector.feed(pcm16)]

    def reset(self) -> None:
        self._detector.reset()

    def listen(self, notify: Callable[[], None]) -> None:
        self._detector.listen(notify)

    def expect_words(self) -> None:
        """Server VAD judges sound alone."""

    def hear(self, words: str | None) -> None:
        """Server VAD judges sound alone."""


class _SemanticDetector(_SileroDetector):
    """Semantic turn detection: the session's transcripts reach the detector."""

    def __init__(self, detector: TurnDetector) -> None:
        super().__init__(detector)
        self._turns = detector

    def expect_words(self) -> None:
        self._turns.expect_words()

    def hear(self, words: str | None) -> None:
        self._turns.hear(words)


def _has_media(request: OmniRequest) -> bool:
    return any(isinstance(p, (ImagePart, VideoPart)) for m in request.messages for p in m.parts)


def _has_audio(request: OmniRequest) -> bool:
    return any(isinstance(p, AudioPart) for m in request.messages for p in m.parts)
