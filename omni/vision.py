"""Image and video input for vision-language models: a conversation -> prompt ids + embedding spans.

``build_vision_prompt`` does what a model's HF processor does to the text: every image (video) part
becomes the model's placeholder, the chat template renders the conversation, and each placeholder
token is repeated once per embedding the vision tower produced for that item. The returned spans
say where those embeddings go and carry the media content hash (the KV prefix-cache key):

    prompt = build_vision_prompt(request, engine.tokenizer, vision_encoder, system_prompt=...)
    engine.generate(prompt.token_ids, params, embed_spans=prompt.embed_spans)

It decodes media and runs the vision tower, so call it off the event loop (``asyncio.to_thread``). A
server calls ``build_vision_prompt_async`` instead: each item's declared pixels are reserved from the
server's ``PixelBudget`` before it is decoded, and released once the vision tower has consumed them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from omni_gateway.encoders.budget import BudgetTimeout, PixelBudget, Reservation
from omni_gateway.encoders.image import ImageDecodeError, ImageLimits, decode_image, image_pixels
from omni_gateway.encoders.video import (
    VideoDecodeError,
    VideoLimits,
    decode_frames,
    decode_video,
    frames_pixels,
    video_pixels,
)
from omni_gateway.encoders.vision import UnusableImage, VisionEncoder, VisualFeatures
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.omni.media import MediaBusy, MediaError, MediaTooLarge
from omni_gateway.omni.prompting import ChatRenderer, Tokenizer, UnsupportedInput, prompt_ids
from omni_gateway.omni.protocol import ImagePart, Message, OmniRequest, TextPart, VideoPart
from PIL import Image


@dataclass(frozen=True, slots=True)
class VisionPrompt:
    token_ids: list[int]
    embed_spans: tuple[EmbedSpan, ...]
    num_image_tokens: int  # image and video placeholder tokens (for usage accounting)
    num_audio_tokens: int = 0  # audio placeholder tokens, for a model that hears (omni.audio_input)


@dataclass(frozen=True, slots=True)
class MediaLimits:
    max_items: int = 16  # image and video parts in one request, counted before anything is decoded
    # Decoded pixels of all images and sampled video frames of one request, from the headers (omni.media).
    max_request_pixels: int = 128_000_000
    image: ImageLimits = field(default_factory=ImageLimits)
    video: VideoLimits = field(default_factory=VideoLimits)


def build_vision_prompt(
    request: OmniRequest,
    tokenizer: Tokenizer,
    encoder: VisionEncoder,
    *,
    system_prompt: str | None = None,
    limits: MediaLimits = MediaLimits(),
    render: ChatRenderer | None = None,
) -> VisionPrompt:
    """Prompt token ids with expanded placeholders and one EmbedSpan per media item, in prompt order.

    Audio parts must already carry their transcript. On a model without video support (LLaVA) a
    video becomes its sampled frames, each an image. Raises ``MediaError`` for refused media
    (``MediaTooLarge`` when they declare more pixels than ``limits.max_request_pixels``) and
    ``UnsupportedInput`` for text that spells the model's placeholder tokens itself. ``render`` is the
    engine's chat renderer (``AsyncEngine.render_chat``); without one the tokenizer's template renders.
    """
    parts = media_parts(request, limits)
    media_pixels(parts, limits)
    per_part = [_features(part, encoder, limits) for part in parts]
    return _assemble(request, tokenizer, encoder, per_part, system_prompt, render)


async def build_vision_prompt_async(
    request: OmniRequest,
    tokenizer: Tokenizer,
    encoder: VisionEncoder,
    budget: PixelBudget,
    *,
    system_prompt: str | None = None,
    limits: MediaLimits = MediaLimits(),
    render: ChatRenderer | None = None,
) -> VisionPrompt:
    """``build_vision_prompt`` on a server: decoding and the tower run in worker threads, one item at a
    time, each within a reservation of its declared pixels from ``budget``. ``MediaBusy`` when the budget
    stays full for its whole wait. A request holds at most one reservation and waits only while it holds
    none, so requests cannot deadlock each other."""
    parts = media_parts(request, limits)
    sizes = await asyncio.to_thread(media_pixels, parts, limits)
    if max(sizes, default=0) > budget.capacity:
        raise MediaTooLarge(
            f"an image or video declares {max(sizes)} pixels; this server decodes at most {budget.capacity} at once"
        )
    per_part = []
    for part, pixels in zip(parts, sizes):
        try:
            reservation = await budget.reserve(pixels)
        except BudgetTimeout as exc:
            raise MediaBusy(str(exc)) from None
        # Handed to the worker with no await in between, so it is released there even if this task is
        # cancelled meanwhile: the pixels are held until the worker lets go of them, not until we stop waiting.
        per_part.append(await asyncio.to_thread(_features_within, reservation, part, encoder, limits))
    return await asyncio.to_thread(_assemble, request, tokenizer, encoder, per_part, system_prompt, render)


def media_parts(request: OmniRequest, limits: MediaLimits) -> list[ImagePart | VideoPart]:
    """The request's image and video parts in prompt order, counted against ``limits.max_items``."""
    parts = [p for m in request.messages for p in m.parts if isinstance(p, (ImagePart, VideoPart))]
    if len(parts) > limits.max_items:
        raise MediaError(f"request has {len(parts)} image/video parts; the limit is {limits.max_items}")
    return parts


def media_pixels(parts: list[ImagePart | VideoPart], limits: MediaLimits) -> list[int]:
    """Pixels each part will hold once decoded, read from the headers only; ``MediaTooLarge`` when they sum
    to more than ``limits.max_request_pixels``, ``MediaError`` for a header that is refused outright."""
    sizes: list[int] = []
    for part in parts:
        try:
            if isinstance(part, ImagePart):
                sizes.append(image_pixels(part.data, limits.image))
            elif part.frames:
                sizes.append(frames_pixels(part.frames, limits.video, limits.image))
            else:
                sizes.append(video_pixels(part.data, limits.video, fps=part.fps))
        except (ImageDecodeError, VideoDecodeError) as exc:
            raise MediaError(str(exc)) from None
    if sum(sizes) > limits.max_request_pixels:
        raise MediaTooLarge(
            f"the request's images and video frames declare {sum(sizes)} pixels; the limit is "
            f"{limits.max_request_pixels} per request"
        )
    return sizes


def _assemble(
    request: OmniRequest,
    tokenizer: Tokenizer,
    encoder: VisionEncoder,
    per_part: list[list[tuple[int, VisualFeatures]]],
    system_prompt: str | None,
    render: ChatRenderer | None,
) -> VisionPrompt:
    from omni_gateway.engine.frontend.chat_template import render_chat

    items = [item for found in per_part for item in found]  # (placeholder id, features) in prompt order
    texts = iter([_placeholder_text(tokenizer, encoder, found) for found in per_part])
    texted = dataclasses.replace(request, messages=tuple(_with_placeholders(m, texts) for m in request.messages))
    if render is None:
        render = functools.partial(render_chat, tokenizer)
    ids = prompt_ids(texted, tokenizer, render, system_prompt=system_prompt, allow_images=True)
    marks = encoder.placeholders
    return expand_placeholders(ids, items, {marks.image, marks.video} - {None})


def expand_placeholders(
    ids: list[int], items: list[tuple[int, VisualFeatures]], placeholder_ids: set[int]
) -> VisionPrompt:
    """Repeat the ``i``-th placeholder token once per embedding of ``items[i]``; spans follow."""
    found = [i for i, t in enumerate(ids) if t in placeholder_ids]
    if len(found) != len(items):
        raise UnsupportedInput(
            f"the prompt holds {len(found)} image/video placeholder tokens for {len(items)} "
            "media items; text may not spell the model's image or video tokens"
        )
    out: list[int] = []
    spans: list[EmbedSpan] = []
    last = 0
    for index, (placeholder, features) in zip(found, items):
        if ids[index] != placeholder:
            raise UnsupportedInput("image and video placeholders in the text are out of order with the media parts")
        out.extend(ids[last:index])
        n = features.num_tokens
        spans.append(
            EmbedSpan(
                offset=len(out),
                length=n,
                key=features.key,
                embeds=features.embeds,
                positions=features.positions,
                position_keys=features.position_keys,
                deepstack=features.deepstack,
            )
        )
        out.extend([placeholder] * n)
        last = index + 1
    out.extend(ids[last:])
    return VisionPrompt(token_ids=out, embed_spans=tuple(spans), num_image_tokens=sum(s.length for s in spans))


def _features_within(
    reservation: Reservation, part: ImagePart | VideoPart, encoder: VisionEncoder, limits: MediaLimits
) -> list[tuple[int, VisualFeatures]]:
    with reservation:  # _features keeps no decoded pixels once it returns or raises
        return _features(part, encoder, limits)


def _features(
    part: ImagePart | VideoPart, encoder: VisionEncoder, limits: MediaLimits
) -> list[tuple[int, VisualFeatures]]:
    marks = encoder.placeholders
    message = None
    try:
        if isinstance(part, ImagePart):
            return [(marks.image, encoder.encode_image(decode_image(part.data, limits.image)))]
        # Frames are sampled at the part's fps capped by the limits' (encoders.video); time positions follow it.
        fps = min(part.fps or limits.video.sample_fps, limits.video.sample_fps)
        features = encoder.encode_video(_decode_video_part(part, limits), fps=fps)  # no local keeps the frames
    except (ImageDecodeError, VideoDecodeError, UnusableImage) as exc:
        message = str(exc)
    if message is not None:
        # Raised outside the handler: the decoder's traceback (and the frames its frames hold) is gone by now.
        raise MediaError(message)
    if marks.video is None:  # no temporal model: the frames go in as consecutive images
        return [(marks.image, f) for f in features]
    return [(marks.video, f) for f in features]


def _decode_video_part(part: VideoPart, limits: MediaLimits) -> list[Image.Image]:
    if part.frames:
        return decode_frames(part.frames, limits.video, limits.image)
    return decode_video(part.data, limits.video, fps=part.fps)


def _placeholder_text(tokenizer: Tokenizer, encoder: VisionEncoder, found: list[tuple[int, VisualFeatures]]) -> str:
    """One placeholder per item (a video on a model without video support is several images)."""
    marks = encoder.placeholders
    pieces = []
    for placeholder, _ in found:
        token = tokenizer.convert_ids_to_tokens(placeholder)
        if marks.start is not None and marks.end is not None:
            token = tokenizer.convert_ids_to_tokens(marks.start) + token + tokenizer.convert_ids_to_tokens(marks.end)
        pieces.append(token)
    return "".join(pieces)


def _with_placeholders(message: Message, texts: Iterator[str]) -> Message:
    parts = [TextPart(next(texts)) if isinstance(p, (ImagePart, VideoPart)) else p for p in message.parts]
    return dataclasses.replace(message, parts=tuple(parts))
