"""Runs one batch of compatible image requests through a diffusers pipeline, with per-request previews.

Previews: at every ``preview_every``-th step the rows of the requests that want one are decoded
together by the pipeline's own VAE. What is decoded is the scheduler's current estimate of the clean
latents where the scheduler keeps one (DPM-Solver++ stores its x0 prediction, which PixArt uses),
otherwise the current noisy latents x_t (flow-matching Euler in SD3: the preview then sharpens out of
noise). The latents are area-pooled first so the preview's long side is at most ``preview_max_side``:
the VAE decoder's cost grows with pixels, and a preview does not need full resolution.

Cancellation: the step hook raises ``_Interrupted`` once every request in the batch is cancelled,
which leaves the pipeline's call at once (no final VAE decode) and frees the worker thread.
"""

from __future__ import annotations

import inspect
import io
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from omni_gateway.kernels.host_copies import to_host
from omni_gateway.omni.heads.dit.options import ImageJobSpec
from omni_gateway.omni.protocol import ImageFinal, ImagePartial
from PIL import Image


@dataclass(frozen=True, slots=True)
class RawImage:
    """A decoded image not yet PNG-encoded: encoding is left to the reader's side so that the denoising
    thread moves on to the next step instead of compressing (a 512 px PNG costs tens of ms of CPU)."""

    pixels: np.ndarray  # uint8 (height, width, 3)
    image_index: int
    seed: int | None = None  # set on final images
    preview_index: int | None = None  # set on previews
    step: int = 0

    def to_chunk(self) -> ImagePartial | ImageFinal:
        png = encode_png(self.pixels)
        if self.preview_index is None:
            return ImageFinal(png=png, image_index=self.image_index, seed=self.seed)
        return ImagePartial(index=self.preview_index, png=png, step=self.step, image_index=self.image_index)


class RunnableJob(Protocol):
    spec: ImageJobSpec

    def is_cancelled(self) -> bool: ...

    def emit(self, image: RawImage) -> None: ...

    def finish(self) -> None: ...


class _Interrupted(Exception):
    pass


@dataclass
class RunnerStats:
    steps_run: int = 0  # denoising steps executed, counted once per batch
    batches_run: int = 0
    images_run: int = 0  # images whose denoising started
    images_finished: int = 0
    largest_batch: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {
                "image_steps_run": self.steps_run,
                "image_batches_run": self.batches_run,
                "image_images_run": self.images_run,
                "image_images_finished": self.images_finished,
                "image_largest_batch": self.largest_batch,
            }


def encode_png(pixels: np.ndarray) -> bytes:
    """``pixels``: uint8 (height, width, 3)."""
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buf, format="PNG")
    return buf.getvalue()


class DiffusersRunner:
    def __init__(self, pipe: Any, *, preview_max_side: int = 256) -> None:
        self.pipe = pipe
        self.preview_max_side = preview_max_side
        self.stats = RunnerStats()
        params = inspect.signature(pipe.__call__).parameters
        self._modern_callback = "callback_on_step_end" in params
        # PixArt bins sizes onto its training aspect ratios and crops back; we validate sizes ourselves
        # and run exactly the requested size. Caption cleaning needs optional packages and changes prompts.
        self._extra = {k: False for k in ("use_resolution_binning", "clean_caption") if k in params}

    def run(self, jobs: Sequence[RunnableJob]) -> None:
        spec0 = jobs[0].spec
        rows: list[tuple[RunnableJob, int]] = [(job, i) for job in jobs for i in range(job.spec.num_images)]
        prompts = [job.spec.prompt for job, _ in rows]
        # CPU generators: the same seed gives the same starting noise on any device.
        generators = [torch.Generator("cpu").manual_seed(job.spec.seeds[i]) for job, i in rows]
        with self.stats._lock:
            self.stats.batches_run += 1
            self.stats.images_run += len(rows)
            self.stats.largest_batch = max(self.stats.largest_batch, len(rows))
        hook = self._hook(jobs, rows)
        if self._modern_callback:

            def on_step_end(pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
                hook(i, kwargs["latents"])
                return {}

            callbacks: dict[str, Any] = {"callback_on_step_end": on_step_end}
        else:
            callbacks = {"callback": lambda i, t, latents: hook(i, latents), "callback_steps": 1}
        try:
            with torch.inference_mode():
                out = self.pipe(
                    prompt=prompts,
                    num_inference_steps=spec0.steps,
                    guidance_scale=spec0.guidance,
                    height=spec0.height,
                    width=spec0.width,
                    generator=generators,
                    output_type="np",
                    **self._extra,
                    **callbacks,
                )
        except _Interrupted:
            for job in jobs:
                job.finish()
            return
        images = _to_uint8(np.asarray(out.images))
        for row, (job, i) in enumerate(rows):
            if not job.is_cancelled():
                job.emit(RawImage(images[row], image_index=i, seed=job.spec.seeds[i]))
                with self.stats._lock:
                    self.stats.images_finished += 1
        for job in jobs:
            job.finish()

    def _hook(self, jobs: Sequence[RunnableJob], rows: list[tuple[RunnableJob, int]]) -> Callable[[int, Any], None]:
        def hook(i: int, latents: torch.Tensor) -> None:
            step = i + 1
            with self.stats._lock:
                self.stats.steps_run += 1
            if all(job.is_cancelled() for job in jobs):
                raise _Interrupted
            wanted = [
                r
                for r, (job, _) in enumerate(rows)
                if job.spec.preview_every and step % job.spec.preview_every == 0 and not job.is_cancelled()
            ]
            if not wanted:
                return
            pixels = self.decode_preview(self._clean_estimate(latents), wanted)
            for k, r in enumerate(wanted):
                job, image_index = rows[r]
                job.emit(
                    RawImage(
                        pixels[k], image_index=image_index, preview_index=step // job.spec.preview_every - 1, step=step
                    )
                )

        return hook

    def _clean_estimate(self, latents: torch.Tensor) -> torch.Tensor:
        scheduler = self.pipe.scheduler
        outputs = getattr(scheduler, "model_outputs", None)
        algorithm = getattr(scheduler.config, "algorithm_type", "")
        if (
            outputs
            and algorithm in ("dpmsolver++", "sde-dpmsolver++")
            and outputs[-1] is not None
            and outputs[-1].shape == latents.shape
        ):
            return outputs[-1]
        return latents

    @torch.inference_mode()
    def decode_preview(self, latents: torch.Tensor, rows: list[int]) -> np.ndarray:
        vae = self.pipe.vae
        x = latents[rows]
        factor = self.pipe.vae_scale_factor
        long_side = max(x.shape[-2], x.shape[-1]) * factor
        shrink = math.ceil(long_side / self.preview_max_side)
        if shrink > 1:
            x = F.interpolate(
                x.float(), size=(max(1, x.shape[-2] // shrink), max(1, x.shape[-1] // shrink)), mode="area"
            )
        x = x.to(vae.dtype) / vae.config.scaling_factor + (getattr(vae.config, "shift_factor", None) or 0.0)
        image = vae.decode(x, return_dict=False)[0]
        image = to_host((image.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1))[0].numpy()
        return _to_uint8(image)


def _to_uint8(images: np.ndarray) -> np.ndarray:
    return (np.clip(images, 0.0, 1.0) * 255).round().astype(np.uint8)
