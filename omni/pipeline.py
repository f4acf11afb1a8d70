"""OmniPipeline: the model side of the gateway (``omni.protocol.OmniBackend``).

One turn: audio parts without a transcript go through ASR, unless the model hears audio itself (its
audio tower turns them into embeddings, ``omni.audio_input``); the conversation is rendered with the
LLM's chat template and streamed from the engine thread; for audio output the text deltas feed the
TTS head, which speaks clause by clause while the text is still being generated; image output goes
to the DiT head. Every stage stops when the consumer closes the stream or calls ``abort``.

This module is the facade and the turn's routing; loading and warm-up live in ``omni.loading``, what
the pipeline offers in ``omni.capabilities``, ASR in ``omni.transcription``, each modality's prompt in
``omni.prompt_build`` (rendered by ``omni.prompting``), the output streams in ``omni.streams``, the
session detectors in ``omni.voice_activity``, and what each model must offer in ``omni.collaborators``.
Only ``InvalidInput`` is the client's fault; any other exception propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from omni_gateway.omni.capabilities import capabilities_of
from omni_gateway.omni.collaborators import (
    Engine,
    ImageHead,
    Recognizer,
    SpeechHead,
    VadModel,
)
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.embedding import embed
from omni_gateway.omni.loading import close_voice, load_pipeline, warm_up
from omni_gateway.omni.media import server_budget
from omni_gateway.omni.prompt_build import build_prompt, count_prompt_tokens
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
    EmbeddingRequest,
    Embeddings,
    Error,
    Health,
    InvalidInput,
    Message,
    OmniRequest,
    OutputChunk,
    Transcription,
    VadSettings,
    VoiceActivityDetector,
)
from omni_gateway.omni.streams import Prompt, drawn, merged, refusal, spoken, written
from omni_gateway.omni.tools import tool_call_format
from omni_gateway.omni.transcription import transcribe_parts, transcribe_pcm16
from omni_gateway.omni.voice_activity import open_detector

if TYPE_CHECKING:
    from omni_gateway.encoders.audio_encoder import AudioEncoder
    from omni_gateway.encoders.vad import VadBatcher
    from omni_gateway.encoders.vision import VisionEncoder
    from omni_gateway.omni.qwen3_speech import Qwen3SpokenModel
    from omni_gateway.omni.speech import SpokenModel


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
        self.capabilities = capabilities_of(
            config,
            model_name=model_name,
            max_context_tokens=max_context_tokens,
            asr=asr,
            tts=tts,
            image_head=image_head,
            vision=vision,
            audio=audio,
            speech=speech,
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
                request = await transcribe_parts(request, self.transcribe)
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
        return await transcribe_pcm16(self.asr, self._asr_lock, pcm16, sample_rate, language=language, prompt=prompt)

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
        from omni_gateway.encoders.vad import VadBatcher

        # every session's windows judged together, off the event loop
        if self._vad_batcher is None:
            self._vad_batcher = VadBatcher(self._vad_session)
        return open_detector(settings, self._vad_batcher)

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """Prompt tokens of a conversation, an upper bound before ASR (``omni.prompt_build.count_prompt_tokens``)."""
        return count_prompt_tokens(messages, hears=self.audio is not None, text_prompt_ids=self.prompt_ids)

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

    def prompt_ids(self, request: OmniRequest) -> list[int]:
        """The prompt of a conversation without media, rendered with the model's chat template."""
        return prompt_ids(
            request, self.engine.tokenizer, self.engine.render_chat, system_prompt=self.config.system_prompt
        )

    async def _prompt(self, request: OmniRequest) -> Prompt:
        return await build_prompt(
            request,
            self.engine,
            vision=self.vision,
            audio=self.audio,
            media_budget=self.media_budget,
            system_prompt=self.config.system_prompt,
        )
