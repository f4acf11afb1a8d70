"""Validation of ``ImageOutputOptions`` against what the loaded model can produce. Pure logic, no torch."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from omni_gateway.omni.heads.dit.errors import ImageRequestError
from omni_gateway.omni.protocol import ImageOutputOptions


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What one model accepts. ``granularity`` is the VAE scale factor times the transformer's patch size:
    a side that is not a multiple of it cannot be split into whole latent patches."""

    granularity: int
    min_side: int
    max_side: int
    min_steps: int
    max_steps: int
    max_images: int
    max_guidance: float
    default_steps: int
    default_guidance: float


@dataclass(frozen=True, slots=True)
class ImageJobSpec:
    prompt: str
    width: int
    height: int
    steps: int
    guidance: float
    seeds: tuple[int, ...]  # one per image; image i of the request is generated from seeds[i]
    preview_every: int

    @property
    def batch_key(self) -> tuple[int, int, int, float]:
        """Requests agreeing on these share one denoising loop; prompts, seeds and previews stay per request."""
        return (self.width, self.height, self.steps, self.guidance)

    @property
    def num_images(self) -> int:
        return len(self.seeds)

    @property
    def num_previews(self) -> int:
        return self.steps // self.preview_every if self.preview_every else 0


def _random_seed() -> int:
    return secrets.randbits(31)


def resolve_job(
    prompt: str, options: ImageOutputOptions, limits: ImageLimits, draw_seed: Callable[[], int] = _random_seed
) -> ImageJobSpec:
    """Fill defaults and check every knob, raising ``ImageRequestError`` that names the offending value."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ImageRequestError("image generation needs a non-empty text prompt")
    width, height = _size(options.size, limits)
    steps = limits.default_steps if options.num_inference_steps is None else options.num_inference_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not limits.min_steps <= steps <= limits.max_steps:
        raise ImageRequestError(
            f"num_inference_steps must be an integer from {limits.min_steps} to "
            f"{limits.max_steps} for this model; got {steps!r}"
        )
    guidance = limits.default_guidance if options.guidance_scale is None else options.guidance_scale
    if (
        isinstance(guidance, bool)
        or not isinstance(guidance, (int, float))
        or not 0.0 <= guidance <= limits.max_guidance
    ):
        raise ImageRequestError(f"guidance_scale must be a number from 0 to {limits.max_guidance:g}; got {guidance!r}")
    every = options.preview_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ImageRequestError(f"preview_every must be a non-negative integer (0: no previews); got {every!r}")
    n = options.n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limits.max_images:
        raise ImageRequestError(f"n must be an integer from 1 to {limits.max_images}; got {n!r}")
    seed = options.seed
    if seed is None:
        seed = draw_seed()
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63 - n:
        raise ImageRequestError(f"seed must be an integer from 0 to 2**63 - 1 - n; got {seed!r}")
    return ImageJobSpec(
        prompt=prompt,
        width=width,
        height=height,
        steps=steps,
        guidance=float(guidance),
        seeds=tuple(seed + i for i in range(n)),
        preview_every=every,
    )


def _size(size: object, limits: ImageLimits) -> tuple[int, int]:
    if (
        not isinstance(size, tuple)
        or len(size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in size)
    ):
        raise ImageRequestError(f"size must be a (width, height) pair of integers; got {size!r}")
    g = limits.granularity
    for name, side in zip(("width", "height"), size):
        if not limits.min_side <= side <= limits.max_side or side % g:
            raise ImageRequestError(
                f"image {name} must be a multiple of {g} from {limits.min_side} to {limits.max_side} "
                f"for this model; got {size[0]}x{size[1]}"
            )
    return size[0], size[1]
