"""Image and video input for vision-language models: a conversation -> prompt ids + embedding spans.

``build_vision_prompt`` does what a model's HF processor does to the text: every image (video) part
becomes the model's placeholder, the chat template renders the conversation, and each placeholder
token is repeated once per embedding the vision tower produced for that item. The returned spans
say where those embeddings go and carry the media content hash (the KV prefix-cache key):

    prompt = build_vision_prompt(request, engine.tokenizer, vision_encoder, system_prompt=...)
    engine.generate(prompt.token_ids, params, embed_spans=prompt.embed_spans)

It decodes media and runs the vision tower, so call it off the event loop (``asyncio.to_thread``).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from omni_gateway.encoders.image import ImageDecodeError, ImageLimits, decode_image
from omni_gateway.encoders.video import VideoDecodeError, VideoLimits, decode_frames, decode_video
from omni_gateway.encoders.vision import UnusableImage, VisionEncoder, VisualFeatures
from omni_gateway.engine.sequence import EmbedSpan
from omni_gateway.omni.prompting import ChatRenderer, Tokenizer, UnsupportedInput, prompt_ids
from omni_gateway.omni.protocol import ImagePart, InvalidInput, Message, OmniRequest, TextPart, VideoPart


class MediaError(InvalidInput):
    """A media part was refused (undecodable, over a limit, too many); the message is client-safe."""


@dataclass(frozen=True, slots=True)
class VisionPrompt:
    token_ids: list[int]
    embed_spans: tuple[EmbedSpan, ...]
    num_image_tokens: int  # placeholder tokens in all (for usage accounting)


@dataclass(frozen=True, slots=True)
class MediaLimits:
    max_items: int = 16  # image and video parts in one request, counted before anything is decoded
    image: ImageLimits = field(default_factory=ImageLimits)
    video: VideoLimits = field(default_factory=VideoLimits)


def build_vision_prompt(request: OmniRequest, tokenizer: Tokenizer, encoder: VisionEncoder, *,
                        system_prompt: str | None = None, limits: MediaLimits = MediaLimits(),
                        render: ChatRenderer | None = None) -> VisionPrompt:
    """Prompt token ids with expanded placeholders and one EmbedSpan per media item, in prompt order.

    Audio parts must already carry their transcript. On a model without video support (LLaVA) a
    video becomes its sampled frames, each an image. Raises ``MediaError`` for refused media and
    ``UnsupportedInput`` for text that spells the model's placeholder tokens itself. ``render`` is the
    engine's chat renderer (``AsyncEngine.render_chat``); without one the tokenizer's template renders.
    """
    from omni_gateway.engine.chat_template import render_chat

    parts = [p for m in request.messages for p in m.parts if isinstance(p, (ImagePart, VideoPart))]
    if len(parts) > limits.max_items:
        raise MediaError(f"request has {len(parts)} image/video parts; the limit is {limits.max_items}")
    per_part = [_features(part, encoder, limits) for part in parts]
    items = [item for found in per_part for item in found]  # (placeholder id, features) in prompt order
    texts = iter([_placeholder_text(tokenizer, encoder, found) for found in per_part])
    texted = dataclasses.replace(request, messages=tuple(_with_placeholders(m, texts) for m in request.messages))
    if render is None:
        render = functools.partial(render_chat, tokenizer)
    ids = prompt_ids(texted, tokenizer, render, system_prompt=system_prompt, allow_images=True)
    marks = encoder.placeholders
    return expand_placeholders(ids, items, {marks.image, marks.video} - {None})


def expand_placeholders(ids: list[int], items: list[tuple[int, VisualFeatures]],
                        placeholder_ids: set[int]) -> VisionPrompt:
    """Repeat the ``i``-th placeholder token once per embedding of ``items[i]``; spans follow."""
    found = [i for i, t in enumerate(ids) if t in placeholder_ids]
    if len(found) != len(items):
        raise UnsupportedInput(f"the prompt holds {len(found)} image/video placeholder tokens for {len(items)} "
                               "media items; text may not spell the model's image or video tokens")
    out: list[int] = []
    spans: list[EmbedSpan] = []
    last = 0
    for index, (placeholder, features) in zip(found, items):
        if ids[index] != placeholder:
            raise UnsupportedInput("image and video placeholders in the text are out of order with the media parts")
        out.extend(ids[last:index])
        n = features.num_tokens
        spans.append(EmbedSpan(offset=len(out), length=n, key=features.key, embeds=features.embeds,
                               positions=features.positions))
        out.extend([placeholder] * n)
        last = index + 1
    out.extend(ids[last:])
    return VisionPrompt(token_ids=out, embed_spans=tuple(spans), num_image_tokens=sum(s.length for s in spans))


def _features(part: ImagePart | VideoPart, encoder: VisionEncoder,
              limits: MediaLimits) -> list[tuple[int, VisualFeatures]]:
    marks = encoder.placeholders
    try:
        if isinstance(part, ImagePart):
            return [(marks.image, encoder.encode_image(decode_image(part.data, limits.image)))]
        if part.frames:
            frames = decode_frames(part.frames, limits.video, limits.image)
        else:
            frames = decode_video(part.data, limits.video, fps=part.fps)
        features = encoder.encode_video(frames)
    except (ImageDecodeError, VideoDecodeError, UnusableImage) as exc:
        raise MediaError(str(exc)) from None
    if marks.video is None:  # no temporal model: the frames go in as consecutive images
        return [(marks.image, f) for f in features]
    return [(marks.video, f) for f in features]


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
