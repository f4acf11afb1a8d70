"""POST /v1/images/generations body -> a validated ``ImageCall``. Pure."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.chat_request import HTTP_PRIORITY
from omni_gateway.gateway.http.errors import invalid
from omni_gateway.gateway.http.fields import get_bool, get_float, get_int, get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import Capabilities, ImageOutputOptions, Message, OmniRequest, TextPart

DEFAULT_SIZE = (256, 256)
MAX_PARTIAL_IMAGES = 3  # as in OpenAI's API


@dataclass(frozen=True, slots=True)
class ImageCall:
    request: OmniRequest
    size: str
    stream: bool
    partial_images: int


def parse_image_generation(body: object, caps: Capabilities, limits: HttpLimits) -> ImageCall:
    body = require_object(body, "body")
    if "image" not in caps.output_modalities:
        raise invalid(
            "no image model configured on this server: image generation is unavailable.",
            "model",
            "unsupported_modality",
        )
    prompt = get_str(body, "prompt", required=True, max_len=4000)
    if not prompt.strip():
        raise invalid("'prompt' must not be empty.", "prompt")
    get_str(body, "model")
    n = get_int(body, "n", 1, lo=1, hi=limits.max_images)
    width, height = _size(get_str(body, "size", "auto"), limits)
    if get_str(body, "response_format", "b64_json") != "b64_json":
        raise invalid(
            "'response_format' must be \"b64_json\": this server hosts no image URLs.",
            "response_format",
            "unsupported_parameter",
        )
    if get_str(body, "output_format", "png") != "png":
        raise invalid("'output_format' must be \"png\" on this server.", "output_format", "unsupported_parameter")
    stream = get_bool(body, "stream")
    partial_images = get_int(body, "partial_images", 0, lo=0, hi=MAX_PARTIAL_IMAGES)
    if partial_images and not stream:
        raise invalid("'partial_images' requires 'stream' to be true.", "partial_images")
    steps = get_int(body, "num_inference_steps", lo=1, hi=200)  # extension: not in OpenAI's API
    preview_every = 0
    if partial_images:
        preview_every = max(1, steps // (partial_images + 1)) if steps else 1
    guidance = get_float(body, "guidance_scale", lo=0.0, hi=50.0)  # extension: not in OpenAI's API
    options = ImageOutputOptions(
        size=(width, height),
        num_inference_steps=steps,
        guidance_scale=guidance,
        seed=get_int(body, "seed", lo=0, hi=2**32 - 1),
        preview_every=preview_every,
        n=n,
    )
    request = OmniRequest(
        request_id=f"img-{uuid.uuid4().hex}",
        messages=(Message("user", (TextPart(prompt),)),),
        modalities=("image",),
        image=options,
        priority=HTTP_PRIORITY,
    )
    return ImageCall(request=request, size=f"{width}x{height}", stream=stream, partial_images=partial_images)


def _size(value: str, limits: HttpLimits) -> tuple[int, int]:
    if value == "auto":
        return DEFAULT_SIZE
    width, sep, height = value.partition("x")
    if not sep or not (width + height).isascii() or not width.isdigit() or not height.isdigit():
        raise invalid(f'\'size\' must be "auto" or "<width>x<height>", got {shown(value)}.', "size")
    w, h = int(width), int(height)
    if not (64 <= w <= limits.max_image_side and 64 <= h <= limits.max_image_side) or w % 8 or h % 8:
        raise invalid(
            f"'size' sides must be multiples of 8 between 64 and {limits.max_image_side}, got {shown(value)}.", "size"
        )
    return w, h
