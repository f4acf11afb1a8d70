"""The narrow interface between the gateway and the models: plain dataclasses, stdlib only.

The gateway builds an ``OmniRequest`` (a conversation of interleaved parts plus the wanted output
modalities) and iterates the ``OutputChunk`` stream the backend yields. Nothing here imports torch,
so ``import gateway`` stays fast and the backend can later live in another process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Role = Literal["system", "user", "assistant", "tool"]
Modality = Literal["text", "audio", "image"]


class InvalidInput(Exception):
    """The request itself is at fault (a refused option, an unusable media part, a modality the loaded models
    cannot take). The only exception the gateway answers as the client's error (HTTP 400); its message is
    client-safe. Any other exception from the backend is a server error."""

    code = "invalid_request"
    status = 400  # 413/429 for media over the request's or the server's budget (omni.media)

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param  # the request field at fault, where one is


# ---- input parts -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class AudioPart:
    """Mono 16-bit little-endian PCM. ``transcript`` is filled when ASR already ran (realtime turns).

    ``encoded`` carries an encoded file (mp3, ...) the gateway does not decode itself, so media decoding
    and its limits stay on the model side; ``pcm16`` is then empty and ``sample_rate`` 0 until decoded.
    ``partial`` marks a turn still being spoken: a model that hears it while spoken
    (``Capabilities.hears_while_spoken``) takes only the start that more audio cannot change.
    """

    pcm16: bytes | bytearray  # a realtime turn's buffer is passed as it is, not copied
    sample_rate: int
    transcript: str | None = None
    encoded: bytes | None = None
    partial: bool = False


@dataclass(frozen=True, slots=True)
class ImagePart:
    data: bytes  # encoded PNG/JPEG/WebP bytes
    mime: str | None = None
    detail: str = "auto"


@dataclass(frozen=True, slots=True)
class VideoPart:
    data: bytes  # an encoded container (mp4/webm) ...
    frames: tuple[bytes, ...] = ()  # ... or already separate JPEG frames (webcam stream)
    fps: float | None = None


Part = TextPart | AudioPart | ImagePart | VideoPart


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    parts: tuple[Part, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()  # assistant messages that called tools
    tool_call_id: str | None = None  # role == "tool": which call this answers

    @property
    def text(self) -> str:
        return "".join(
            p.text if isinstance(p, TextPart) else (p.transcript or "") if isinstance(p, AudioPart) else ""
            for p in self.parts
        )


ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """What every generated choice must match (vLLM's structured outputs). ``spec`` is the JSON schema
    as JSON text, the regex or the EBNF grammar ("" for json_object); ``choices`` the strings of a
    choice. ``param`` names the request field it came from, for the error a bad one gets."""

    kind: ConstraintKind
    spec: str = ""
    choices: tuple[str, ...] = ()
    param: str = ""


ToolChoice = Literal["auto", "required"]


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """OpenAI-level knobs; the backend maps them onto the engine's SamplingParams."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    n: int = 1
    constraint: OutputConstraint | None = None


@dataclass(frozen=True, slots=True)
class AudioOutputOptions:
    voice: str | None = None
    sample_rate: int = 24000
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class ImageOutputOptions:
    size: tuple[int, int] = (256, 256)  # (width, height)
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    preview_every: int = 0  # 0: no previews
    n: int = 1


@dataclass(frozen=True, slots=True)
class OmniRequest:
    request_id: str
    messages: tuple[Message, ...]
    modalities: tuple[Modality, ...] = ("text",)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    audio: AudioOutputOptions = field(default_factory=AudioOutputOptions)
    image: ImageOutputOptions = field(default_factory=ImageOutputOptions)
    tools: tuple[dict[str, Any], ...] = ()  # JSON-schema function tools, passed through the chat template
    # "required": answer with calls of ``tools`` only (a named tool_choice is "required" of that one
    # tool); "auto": text, calls or both. Calls follow the tool's parameters either way.
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    raw_prompt: str | None = None  # /v1/completions: a prompt used as is, no chat template
    priority: int = 0  # 0 realtime turns, 1 bulk HTTP work
    session_id: str | None = None  # a realtime session's id: all its turns go to one engine replica
    # The served model the client chose: the base model, or a LoRA adapter over it by name; None: the base.
    model: str | None = None
    # Compute the prompt into the prefix cache as the reply with these modalities will (a speaking model's
    # thinker keeps the hidden states its talker will read) and answer one token of text, nothing more.
    prefill_only: bool = False


# ---- output chunks -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    index: int = 0  # choice index when n > 1
    logprobs: tuple[tuple[str, float, tuple[tuple[str, float], ...]], ...] = ()  # (token, logprob, top)


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """At most 100 ms of mono pcm16; ``transcript`` is the text this audio speaks (may be empty)."""

    pcm16: bytes
    sample_rate: int
    transcript: str = ""


@dataclass(frozen=True, slots=True)
class ImagePartial:
    index: int  # which preview, 0-based
    png: bytes
    step: int
    image_index: int = 0


@dataclass(frozen=True, slots=True)
class ImageFinal:
    png: bytes
    image_index: int = 0
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """A piece of a tool call's arguments as they are generated; the complete ``ToolCallDelta`` of
    the same ``call_id`` follows once the call is closed."""

    call_id: str
    name: str
    delta: str
    index: int = 0  # choice index when n > 1


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    call_id: str
    name: str
    arguments: str  # complete JSON arguments
    index: int = 0  # choice index when n > 1


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    input_audio_tokens: int = 0
    input_image_tokens: int = 0
    output_audio_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Done:
    finish_reason: str  # "stop" | "length" | "abort" | "tool_calls" | "error"
    index: int = 0
    stop_sequence: str | None = None  # the request's stop string that ended the answer, when one did


@dataclass(frozen=True, slots=True)
class Error:
    code: str  # machine-readable, e.g. "invalid_request", "overloaded", "unsupported_modality", "engine_dead"
    message: str
    status: int = 400  # the HTTP status this maps to
    param: str | None = None  # the request field at fault, where one is


OutputChunk = (
    TextDelta | AudioChunk | ImagePartial | ImageFinal | ToolCallArguments | ToolCallDelta | Usage | Done | Error
)


# ---- embeddings ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """Prompts to pool into one vector each (``/v1/embeddings``): text, or token ids used as they are."""

    request_id: str
    inputs: tuple[str | tuple[int, ...], ...]
    priority: int = 1


@dataclass(frozen=True, slots=True)
class Embeddings:
    vectors: tuple[tuple[float, ...], ...]  # one L2-normalized vector per input, in order
    prompt_tokens: int


# ---- audio services the gateway uses directly ----------------------------------------------------
@dataclass(frozen=True, slots=True)
class Transcription:
    text: str
    language: str | None = None
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class VadEvent:
    """A turn boundary, or a hint inside a turn.

    ``speech_paused`` (the first silent moment while speaking; ``audio_ms`` is where the speech so far
    ends) and ``speech_resumed`` (speech came back before the pause became a stop) are internal hints
    that let the gateway transcribe a turn while the detector waits out the silence; they are never
    sent to clients. A ``speech_stopped`` follows the ``speech_paused`` of its own pause.
    """

    kind: Literal["speech_started", "speech_paused", "speech_resumed", "speech_stopped"]
    audio_ms: int  # ms since the start of the stream fed to this detector


@dataclass(frozen=True, slots=True)
class VadSettings:
    """``eagerness`` set asks for semantic turn detection: a pause ends a turn as soon as an end-of-turn model
    and the turn's words say it is finished, and a turn that sounds unfinished waits for more, up to the
    eagerness's cap (8 / 4 / 2 s for low / medium and auto / high). Unset, every pause of
    ``silence_duration_ms`` ends the turn."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


class VoiceActivityDetector(Protocol):
    """Streaming speech detector for one session; fed 24 kHz mono pcm16 of any chunk size.

    ``feed`` returns the events judged so far that it has not returned before. A detector that judges off
    the caller's thread (batched across sessions) returns them later: it calls the ``listen`` callback,
    from any thread, when events are ready, and ``feed(b"")`` then returns them.

    A detector that weighs the turn's words (semantic turn detection) learns them from its session:
    ``expect_words`` when a transcript of the turn up to the current pause is under way, ``hear`` once it is
    in (None if it failed). Detectors that judge sound alone ignore both.
    """

    def feed(self, pcm16: bytes) -> list[VadEvent]: ...

    def reset(self) -> None: ...

    def listen(self, notify: Callable[[], None]) -> None: ...

    def expect_words(self) -> None: ...

    def hear(self, words: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Capabilities:
    model: str
    input_modalities: frozenset[str]  # subset of {"text", "audio", "image", "video"}
    output_modalities: frozenset[str]  # subset of {"text", "audio", "image"}
    voices: tuple[str, ...] = ()
    max_context_tokens: int = 0
    # The model hears audio itself: a user's audio goes to it directly, ASR only reports transcripts.
    hears_audio: bool = False
    # It hears a turn while it is spoken (its audio tower's embeddings of a clip's start do not change as the
    # clip grows): the reply's prompt can be prefilled with the audio so far.
    hears_while_spoken: bool = False
    # LoRA adapters can be served over the model (by ``model`` name) and loaded or unloaded at run time.
    serves_lora: bool = False

    def offers_voice(self, voice: str) -> bool:
        """Whether a request may ask for ``voice``: one of ``voices``, or any when the backend names none (it
        does not speak, or does not say as whom)."""
        return not self.voices or voice in self.voices


class OmniBackend(Protocol):
    """What the gateway needs from the model side. Implemented by ``omni.pipeline.OmniPipeline``."""

    capabilities: Capabilities

    def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        """Stream the response. Closing the iterator early (or ``abort``) cancels every stage."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def transcribe(
        self, pcm16: bytes, sample_rate: int, *, language: str | None = None, prompt: str | None = None
    ) -> Transcription: ...

    def synthesize(self, text: str, options: AudioOutputOptions) -> AsyncIterator[AudioChunk]: ...

    async def embed(self, request: EmbeddingRequest) -> Embeddings | Error:
        """Every input pooled by the LLM, batched through its engine; an ``Error`` where it refuses them."""
        ...

    def new_vad(self, settings: VadSettings) -> VoiceActivityDetector: ...

    def count_tokens(self, messages: tuple[Message, ...]) -> int: ...

    def health(self) -> Health: ...

    def metrics(self) -> dict[str, float]: ...

    def lora_adapters(self) -> dict[str, str]:
        """The LoRA adapters served now: name -> the folder it was loaded from (empty without LoRA)."""
        ...

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Serve the PEFT adapter in folder ``path`` as ``name``; raises InvalidInput saying why not."""
        ...

    async def unload_lora_adapter(self, name: str) -> None:
        """Stop serving ``name`` to new requests; raises InvalidInput where it is not loaded."""
        ...
