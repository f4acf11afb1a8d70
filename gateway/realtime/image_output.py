"""The ``image`` object of ``response.create`` (an extension): what an image-generating response makes.

``{"size": "512x512", "partial_images": 2, "num_inference_steps": 20, "seed": 7}``, every key optional,
named as in OpenAI's image APIs. Previews are spread over the denoising steps the same way the HTTP
``/v1/images/generations`` route spreads them.
"""

from __future__ import annotations

from typing import Any

from omni_gateway.gateway.realtime.errors import invalid_type, invalid_value
from omni_gateway.omni.protocol import ImageOutputOptions

MAX_PARTIAL_IMAGES = 3  # as in OpenAI's image APIs
MAX_SIDE = 2048
MAX_STEPS = 200


def _int(raw: dict[str, Any], key: str, param: str, lo: int, hi: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid_type(f"{param}.{key}", "an integer", value)
    if not lo <= value <= hi:
        raise invalid_value(f"{param}.{key}", f"an integer from {lo} to {hi}", value)
    return value


def parse_image_options(raw: Any, param: str = "response.image") -> ImageOutputOptions:
    if raw is None:
        return ImageOutputOptions()
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    size = ImageOutputOptions().size
    if raw.get("size") is not None:
        text = raw["size"]
        width, _, height = text.partition("x") if isinstance(text, str) else ("", "", "")
        if not (width.isascii() and width.isdigit() and height.isascii() and height.isdigit()) or not all(
            64 <= int(side) <= MAX_SIDE and int(side) % 8 == 0 for side in (width, height)
        ):
            raise invalid_value(
                f"{param}.size", f"'<width>x<height>' with sides multiples of 8 from 64 to {MAX_SIDE}", text
            )
        size = (int(width), int(height))
    partials = _int(raw, "partial_images", param, 0, MAX_PARTIAL_IMAGES) or 0
    steps = _int(raw, "num_inference_steps", param, 1, MAX_STEPS)
    seed = _int(raw, "seed", param, 0, 2**63 - 1)
    preview_every = (max(1, steps // (partials + 1)) if steps else 1) if partials else 0
    return ImageOutputOptions(size=size, num_inference_steps=steps, seed=seed, preview_every=preview_every)


def render_size(options: ImageOutputOptions) -> str:
    return f"{options.size[0]}x{options.size[1]}"
