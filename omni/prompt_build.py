"""A request's prompt for the engine, by what it carries: text alone, audio for a model that hears, or images
and video for a model that sees; and the upper bound of a conversation's prompt tokens before ASR.

Media decoding and the towers are heavy: worker threads run them, within the server's pixel budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from omni_gateway.encoders.budget import PixelBudget
from omni_gateway.omni.collaborators import Engine
from omni_gateway.omni.prompting import prompt_ids
from omni_gateway.omni.protocol import AudioPart, ImagePart, Message, OmniRequest, VideoPart
from omni_gateway.omni.streams import Prompt

if TYPE_CHECKING:
    from omni_gateway.encoders.audio_encoder import AudioEncoder
    from omni_gateway.encoders.vision import VisionEncoder

# Fast English speech is ~3 words/s, ~4 tokens/s; count more so the estimate stays an upper bound.
_SPEECH_TOKENS_PER_SECOND = 8
# A model that hears takes 25 audio tokens per second (Qwen2-Audio, Qwen2.5-Omni; Voxtral 12.5), plus its markers.
_HEARD_TOKENS_PER_SECOND = 26


async def build_prompt(
    request: OmniRequest,
    engine: Engine,
    *,
    vision: VisionEncoder | None,
    audio: AudioEncoder | None,
    media_budget: PixelBudget,
    system_prompt: str | None,
) -> Prompt:
    if audio is not None and _has_audio(request):
        from omni_gateway.omni.audio_input import build_audio_prompt_async

        built = await build_audio_prompt_async(
            request,
            engine.tokenizer,
            audio,
            vision,
            media_budget,
            system_prompt=system_prompt,
            render=engine.render_chat,
        )
        return Prompt(built.token_ids, built.embed_spans, built.num_image_tokens, built.num_audio_tokens)
    if vision is None or not _has_media(request):
        return Prompt(prompt_ids(request, engine.tokenizer, engine.render_chat, system_prompt=system_prompt))
    from omni_gateway.omni.vision import build_vision_prompt_async

    built_seen = await build_vision_prompt_async(
        request,
        engine.tokenizer,
        vision,
        media_budget,
        system_prompt=system_prompt,
        render=engine.render_chat,
    )
    return Prompt(built_seen.token_ids, built_seen.embed_spans, built_seen.num_image_tokens)


def count_prompt_tokens(
    messages: tuple[Message, ...], *, hears: bool, text_prompt_ids: Callable[[OmniRequest], list[int]]
) -> int:
    """Prompt tokens of a conversation. Audio not yet transcribed counts by its duration, at a rate
    above what speech produces, so a size check made before ASR never lets a too-long prompt through.
    Image and video tokens are not counted here: the engine checks the expanded prompt's length."""
    estimate = 0
    counted = []
    for message in messages:
        parts = []
        for part in message.parts:
            if isinstance(part, AudioPart) and (part.transcript is None or hears):
                seconds = len(part.pcm16) / 2 / part.sample_rate if part.sample_rate else 0.0
                if getattr(part, "encoded", None):
                    seconds = len(part.encoded) / 4000  # ~32 kbit/s: a low bitrate for speech, an upper bound
                rate = _HEARD_TOKENS_PER_SECOND if hears else _SPEECH_TOKENS_PER_SECOND
                estimate += int(seconds * rate) + 3
                part = dataclasses.replace(part, transcript="")
            if isinstance(part, (ImagePart, VideoPart)):
                continue
            parts.append(part)
        counted.append(dataclasses.replace(message, parts=tuple(parts)))
    return len(text_prompt_ids(OmniRequest(request_id="count", messages=tuple(counted)))) + estimate


def _has_media(request: OmniRequest) -> bool:
    return any(isinstance(p, (ImagePart, VideoPart)) for m in request.messages for p in m.parts)


def _has_audio(request: OmniRequest) -> bool:
    return any(isinstance(p, AudioPart) for m in request.messages for p in m.parts)
