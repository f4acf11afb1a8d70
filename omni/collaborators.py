"""What the pipeline needs of each model it drives: structural types, so tests pass light fakes.

Each matches the real object named in its docstring; nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from omni_gateway.omni.protocol import AudioChunk, AudioOutputOptions, ImageFinal, ImageOutputOptions, ImagePartial

if TYPE_CHECKING:
    from omni_gateway.engine.outputs import StreamDelta
    from omni_gateway.engine.sampling_params import SamplingParams
    from omni_gateway.omni.prompting import Tokenizer


class Engine(Protocol):
    """``engine.frontend.async_engine.AsyncEngine``."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str: ...

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: int = 0,
        **kwargs: Any,
    ) -> AsyncIterator[StreamDelta]: ...

    def abort(self, request_id: str) -> None: ...

    def health(self) -> Mapping[str, Any]: ...

    def stats(self) -> Mapping[str, float]: ...

    def shutdown(self) -> None: ...


class Transcript(Protocol):
    """``encoders.asr.AsrResult``."""

    @property
    def text(self) -> str: ...

    @property
    def language(self) -> str | None: ...

    @property
    def duration_s(self) -> float: ...


class Recognizer(Protocol):
    """``encoders.asr.SpeechRecognizer`` (faster-whisper or the torch Whisper)."""

    def transcribe(
        self, audio: bytes, *, sample_rate: int = ..., language: str | None = None, prompt: str | None = None
    ) -> Transcript: ...


class SpeechHead(Protocol):
    """``omni.heads.tts.head.TtsHead``."""

    @property
    def voices(self) -> tuple[str, ...]: ...

    def synthesize(self, text: str, options: AudioOutputOptions = ...) -> Any: ...

    def stream(
        self, text_deltas: AsyncIterator[str], options: AudioOutputOptions = ...
    ) -> AsyncIterator[AudioChunk]: ...


class CancelFlag(Protocol):
    def is_set(self) -> bool: ...


class ImageHead(Protocol):
    """``omni.heads.dit.head.ImageHead``."""

    def generate(
        self, prompt: str, options: ImageOutputOptions, cancel: CancelFlag | None = None
    ) -> AsyncIterator[ImagePartial | ImageFinal]: ...

    def close(self) -> None: ...


class SpeechEvent(Protocol):
    """``encoders.vad.SpeechEvent``."""

    @property
    def kind(self) -> str: ...

    @property
    def audio_ms(self) -> int: ...


class SpeechDetector(Protocol):
    """``encoders.vad.SileroVad``: one per session, over the shared model session."""

    def feed(self, pcm16: bytes) -> Sequence[SpeechEvent]: ...

    def reset(self) -> None: ...

    def listen(self, notify: Callable[[], None]) -> None: ...


class TurnDetector(SpeechDetector, Protocol):
    """``encoders.turn.SemanticTurn``: a speech detector that also weighs the turn's words."""

    def expect_words(self) -> None: ...

    def hear(self, words: str | None) -> None: ...


class VadModel(Protocol):
    """The loaded silero-vad model (``encoders.vad.load_session``), shared by every session's detector."""

    def run(self, output_names: Any, input_feed: Mapping[str, Any]) -> Any: ...
