"""What a loaded pipeline offers the gateway: the modalities it takes and gives, its voices, its context."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni_gateway.omni.collaborators import ImageHead, Recognizer, SpeechHead
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.protocol import Capabilities

if TYPE_CHECKING:
    from omni_gateway.encoders.audio_encoder import AudioEncoder
    from omni_gateway.encoders.vision import VisionEncoder
    from omni_gateway.omni.qwen3_speech import Qwen3SpokenModel
    from omni_gateway.omni.speech import SpokenModel


def capabilities_of(
    config: OmniConfig,
    *,
    model_name: str,
    max_context_tokens: int,
    asr: Recognizer | None,
    tts: SpeechHead | None,
    image_head: ImageHead | None,
    vision: VisionEncoder | None,
    audio: AudioEncoder | None,
    speech: SpokenModel | Qwen3SpokenModel | None,
) -> Capabilities:
    hears = audio is not None
    seen = {"image", "video"} if vision is not None else set()
    inputs = {"text"} | ({"audio"} if asr is not None or hears else set()) | seen
    speaks = tts is not None or speech is not None
    outputs = {"text"} | ({"audio"} if speaks else set()) | ({"image"} if image_head is not None else set())
    return Capabilities(
        model=config.served_model_name or model_name,
        input_modalities=frozenset(inputs),
        output_modalities=frozenset(outputs),
        voices=tuple(speech.voices) if speech is not None else tuple(tts.voices) if tts is not None else (),
        max_context_tokens=max_context_tokens,
        hears_audio=hears,
        hears_while_spoken=audio is not None and audio.chunk_stable,
        serves_lora=config.engine.enable_lora,
    )
