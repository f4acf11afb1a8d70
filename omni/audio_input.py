"""Audio input for models that hear: a conversation -> prompt ids + embedding spans, audio included.

Like ``omni.vision.build_vision_prompt``, with audio parts as media too: each clip becomes the model's
audio placeholder (between its audio start/end tokens where it has them), repeated once per embedding
the audio tower produced, and its span carries the clip's content hash, so an earlier turn's audio is
neither encoded (encoder cache) nor prefilled (KV prefix cache) again. Images and videos go through the
vision tower when the model also sees (the Qwen2.5-Omni thinker):

    prompt = build_audio_prompt(request, engine.tokenizer, audio_encoder, vision_encoder)
    engine.generate(prompt.token_ids, params, embed_spans=prompt.embed_spans)

An audio part's transcript, if ASR gave it one, is not used: the model hears the audio itself. On the
Qwen2.5-Omni and Qwen3-Omni thinkers a video file with sound is heard too, its audio interleaved with its frames
(``omni.audio_in_video``) unless ``audio_in_video=False``. It decodes media and runs the towers, so call
it off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from omni_gateway.encoders.audio import AudioDecodeError, AudioLimits, NoAudioStream, decode_audio, pcm16_to_float
from omni_gateway.encoders.audio_encoder import AudioEncoder, UnusableAudio
from omni_gateway.encoders.audio_tower import OmniAudioTower
from omni_gateway.encoders.budget import BudgetTimeout, PixelBudget, Reservation
from omni_gateway.encoders.qwen3_omni_audio import Qwen3OmniAudioTower
from omni_gateway.encoders.vision import VisionEncoder, VisualFeatures
from omni_gateway.omni.audio_in_video import Interleaved, interleave, interleave_by_time
from omni_gateway.omni.media import MediaBusy, MediaError, MediaTooLarge
from omni_gateway.omni.prompting import ChatRenderer, Tokenizer, UnsupportedInput, prompt_ids
from omni_gateway.omni.protocol import AudioPart, ImagePart, Message, OmniRequest, TextPart, VideoPart
from omni_gateway.omni.vision import MediaLimits, VisionPrompt, _features, expand_placeholders, media_pixels

Item = tuple[int, VisualFeatures]  # (placeholder token id, features) of one span
# The span key of audio keyed per token (the tokens' own keys hash the tower's settings and their frames).
_GROUPED_AUDIO = "audio-groups"


@dataclass(frozen=True, slots=True)
class AudioInputLimits:
    max_clips: int = 16  # audio parts in one request, counted before anything is decoded
    audio: AudioLimits = field(default_factory=AudioLimits)


def build_audio_prompt(
    request: OmniRequest,
    tokenizer: Tokenizer,
    audio: AudioEncoder,
    vision: VisionEncoder | None = None,
    *,
    system_prompt: str | None = None,
    limits: MediaLimits = MediaLimits(),
    audio_limits: AudioInputLimits = AudioInputLimits(),
    render: ChatRenderer | None = None,
    audio_in_video: bool = True,
) -> VisionPrompt:
    """Prompt token ids with expanded audio (and image/video) placeholders and one EmbedSpan per clip or
    picture, in prompt order. ``MediaError`` for audio or media that is refused (undecodable, over a
    limit, longer than the model's window), ``UnsupportedInput`` for images on a model that does not see
    or text that spells the model's placeholder tokens."""
    parts = [p for m in request.messages for p in m.parts if isinstance(p, (AudioPart, ImagePart, VideoPart))]
    clips = sum(isinstance(p, AudioPart) for p in parts)
    if clips > audio_limits.max_clips:
        raise MediaError(f"request has {clips} audio parts; the limit is {audio_limits.max_clips}")
    visual = [p for p in parts if not isinstance(p, AudioPart)]
    if visual and vision is None:
        raise UnsupportedInput("this model takes no image or video input")
    if len(visual) > limits.max_items:
        raise MediaError(f"request has {len(visual)} image/video parts; the limit is {limits.max_items}")
    media_pixels(visual, limits)
    per_part: list[list[Item] | Interleaved] = []
    for part in parts:
        if isinstance(part, AudioPart):
            per_part.append([(audio.placeholders.audio, audio_features(part, audio, audio_limits.audio))])
            continue
        assert vision is not None
        heard = None
        if audio_in_video and isinstance(part, VideoPart) and isinstance(audio, (OmniAudioTower, Qwen3OmniAudioTower)):
            heard = video_with_audio(part, audio, vision, limits, audio_limits.audio)
        per_part.append(heard if heard is not None else _features(part, vision, limits))
    return _assemble(request, tokenizer, audio, vision, per_part, system_prompt, render)


async def build_audio_prompt_async(
    request: OmniRequest,
    tokenizer: Tokenizer,
    audio: AudioEncoder,
    vision: VisionEncoder | None,
    budget: PixelBudget,
    *,
    system_prompt: str | None = None,
    limits: MediaLimits = MediaLimits(),
    render: ChatRenderer | None = None,
) -> VisionPrompt:
    """``build_audio_prompt`` in a worker thread, holding the declared pixels of the request's images and
    video frames from ``budget`` until the towers have consumed them (``MediaBusy`` when it stays full)."""
    visual = [p for m in request.messages for p in m.parts if isinstance(p, (ImagePart, VideoPart))]
    pixels = sum(await asyncio.to_thread(media_pixels, visual, limits)) if visual and vision is not None else 0
    if pixels > budget.capacity:
        raise MediaTooLarge(
            f"the request's media declare {pixels} pixels; this server decodes at most {budget.capacity}"
        )
    try:
        reservation = await budget.reserve(pixels)
    except BudgetTimeout as exc:
        raise MediaBusy(str(exc)) from None
    build = functools.partial(
        build_audio_prompt, request, tokenizer, audio, vision, system_prompt=system_prompt, limits=limits, render=render
    )
    # Handed to the worker with no await in between: released there even if this task is cancelled meanwhile.
    return await asyncio.to_thread(_within, reservation, build)


def _within(reservation: Reservation, build: Callable[[], VisionPrompt]) -> VisionPrompt:
    with reservation:
        return build()


def video_with_audio(
    part: VideoPart,
    audio: OmniAudioTower | Qwen3OmniAudioTower,
    vision: VisionEncoder,
    limits: MediaLimits,
    audio_limits: AudioLimits,
) -> Interleaved | None:
    """The video's frames and sound as one interleaved span; None for a silent video or separate frames."""
    if not part.data:
        return None
    message = None
    try:
        decoded = decode_audio(part.data, limits=audio_limits)
        clip = audio.encode(decoded.samples, decoded.sample_rate)
    except NoAudioStream:
        return None
    except (AudioDecodeError, UnusableAudio) as exc:
        message = str(exc)
    if message is not None:
        raise MediaError(f"the sound of a video was refused: {message}")
    ((_, video),) = _features(part, vision, limits)
    if isinstance(audio, Qwen3OmniAudioTower):
        return interleave_by_time(video, clip.embeds, clip.key, audio)
    return interleave(video, clip.embeds, clip.key, audio)


def audio_features(part: AudioPart, encoder: AudioEncoder, limits: AudioLimits) -> VisualFeatures:
    """The clip's embeddings as a span's features (audio positions run like text: no M-RoPE offsets, so a
    clip's first tokens sit where they would in any longer clip). A ``partial`` part (a turn still spoken)
    is heard as far as it is settled. Embeddings encoded group by group are keyed per token by their group,
    so the prefix cache shares the KV of a clip's start with every clip that begins the same."""
    samples, rate = decode_audio_part(part, limits)
    try:
        features = encoder.encode(samples, rate, settled_only=part.partial)
    except UnusableAudio as exc:
        raise MediaError(str(exc)) from None
    if features.position_keys:
        return VisualFeatures(embeds=features.embeds, key=_GROUPED_AUDIO, position_keys=features.position_keys)
    return VisualFeatures(embeds=features.embeds, key=features.key)


def decode_audio_part(part: AudioPart, limits: AudioLimits) -> tuple[np.ndarray, int]:
    """float32 mono samples and their rate; ``MediaError`` for bytes that are not audio or exceed a limit."""
    message = None
    try:
        if part.encoded:
            decoded = decode_audio(part.encoded, limits=limits)
            return decoded.samples, decoded.sample_rate
        if part.sample_rate <= 0:
            raise AudioDecodeError(f"pcm16 audio needs a positive sample rate, got {part.sample_rate}")
        samples = pcm16_to_float(bytes(part.pcm16))
    except (AudioDecodeError, ValueError) as exc:
        message = str(exc)
    if message is not None:
        raise MediaError(f"an audio part was refused: {message}")
    if samples.size > limits.max_duration_s * part.sample_rate:
        raise MediaError(
            f"an audio part is {samples.size / part.sample_rate:.1f} s; the limit is {limits.max_duration_s:g} s"
        )
    return samples, part.sample_rate


def _assemble(
    request: OmniRequest,
    tokenizer: Tokenizer,
    audio: AudioEncoder,
    vision: VisionEncoder | None,
    per_part: list[list[Item] | Interleaved],
    system_prompt: str | None,
    render: ChatRenderer | None,
) -> VisionPrompt:
    from omni_gateway.engine.frontend.chat_template import render_chat
    from omni_gateway.omni.vision import _placeholder_text

    texts = []
    items: list[Item] = []
    rewrites: list[list[int] | None] = []  # per item: the token ids its span must hold, if not its placeholder
    for found in per_part:
        if isinstance(found, Interleaved):
            assert vision is not None and vision.placeholders.start is not None and vision.placeholders.video
            # <|vision_bos|> stays text; one video placeholder stands for the span from <|audio_bos|> on.
            texts.append(
                "".join(
                    tokenizer.convert_ids_to_tokens(i) for i in (vision.placeholders.start, vision.placeholders.video)
                )
            )
            items.append((vision.placeholders.video, found.features))
            rewrites.append(found.token_ids)
            continue
        if found and found[0][0] == audio.placeholders.audio:
            texts.append(_audio_text(tokenizer, audio))
        else:
            assert vision is not None
            texts.append(_placeholder_text(tokenizer, vision, found))
        items += found
        rewrites += [None] * len(found)
    pieces = iter(texts)
    messages = tuple(_with_placeholders(m, pieces) for m in request.messages)
    texted = dataclasses.replace(request, messages=messages)
    if render is None:
        render = functools.partial(render_chat, tokenizer)
    ids = prompt_ids(texted, tokenizer, render, system_prompt=system_prompt, allow_images=True)
    marks = {audio.placeholders.audio}
    if vision is not None:
        marks |= {vision.placeholders.image, vision.placeholders.video} - {None}
    built = expand_placeholders(ids, items, marks)
    token_ids = list(built.token_ids)
    for span, wanted in zip(built.embed_spans, rewrites):
        if wanted is not None:
            token_ids[span.offset : span.offset + span.length] = wanted
    heard = sum(
        t == audio.placeholders.audio for s in built.embed_spans for t in token_ids[s.offset : s.offset + s.length]
    )
    return dataclasses.replace(
        built, token_ids=token_ids, num_image_tokens=built.num_image_tokens - heard, num_audio_tokens=heard
    )


def _audio_text(tokenizer: Tokenizer, encoder: AudioEncoder) -> str:
    marks = encoder.placeholders
    ids = [i for i in (marks.start, marks.audio, marks.end) if i is not None]
    return "".join(tokenizer.convert_ids_to_tokens(i) for i in ids)


def _with_placeholders(message: Message, texts: object) -> Message:
    parts = [
        TextPart(next(texts)) if isinstance(p, (AudioPart, ImagePart, VideoPart)) else p  # type: ignore[call-overload]
        for p in message.parts
    ]
    return dataclasses.replace(message, parts=tuple(parts))
