"""Image output head: a diffusion-transformer pipeline that streams progressive previews, then the image.

``ImageHead.generate`` validates the options, queues the request on the ``ImageBatcher`` (whose single
worker thread owns the model) and relays what the worker produces through a bounded asyncio queue:
``ImagePartial`` every ``preview_every`` steps for each image, then one ``ImageFinal`` per image.
Images cross the queue as pixels and are PNG-encoded in a pool thread on the reader's side. A full
queue makes the worker wait (checking for cancellation), so a slow reader slows its batch instead of
piling up images. Setting ``cancel`` or closing the iterator stops the denoising loop at its
next step once no other request in the batch still wants it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from omni_gateway.omni.heads.dit.batcher import ImageBatcher
from omni_gateway.omni.heads.dit.errors import ImageGenerationError
from omni_gateway.omni.heads.dit.loader import ImageHeadConfig, image_limits, load_pipeline, select_device
from omni_gateway.omni.heads.dit.options import ImageJobSpec, ImageLimits, resolve_job
from omni_gateway.omni.heads.dit.runner import DiffusersRunner, RawImage
from omni_gateway.omni.protocol import ImageFinal, ImageOutputOptions, ImagePartial

_POLL_S = 0.05  # how often a blocked producer or an idle consumer looks at the cancel flag


class CancelFlag(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


_END = object()


class _StreamJob:
    """One request as the batch worker sees it; the worker thread calls ``emit``/``finish``/``fail``."""

    def __init__(
        self, spec: ImageJobSpec, cancel: CancelFlag, loop: asyncio.AbstractEventLoop, queue_size: int
    ) -> None:
        self.spec = spec
        self.queue: asyncio.Queue[object] = asyncio.Queue(maxsize=queue_size)
        self._cancel = cancel
        self._abandoned = threading.Event()
        self._loop = loop
        self._ended = False

    @property
    def batch_key(self) -> tuple[int, int, int, float]:
        return self.spec.batch_key

    @property
    def num_images(self) -> int:
        return self.spec.num_images

    def is_cancelled(self) -> bool:
        return self._abandoned.is_set() or self._cancel.is_set()

    def abandon(self) -> None:
        self._abandoned.set()

    def emit(self, image: RawImage) -> None:
        self._put(image)

    def finish(self) -> None:
        if not self._ended:
            self._ended = True
            self._put(_END)

    def fail(self, error: BaseException) -> None:
        if not self._ended:
            self._ended = True
            self._put(_Failed(error))

    def _put(self, item: object) -> None:
        """Blocks the worker while the reader's queue is full, but never past a cancellation."""
        if self.is_cancelled():
            return
        try:
            future = asyncio.run_coroutine_threadsafe(self.queue.put(item), self._loop)
        except RuntimeError:  # the reader's event loop is gone
            self.abandon()
            return
        while True:
            try:
                future.result(timeout=_POLL_S)
                return
            except concurrent.futures.TimeoutError:
                if self.is_cancelled():
                    future.cancel()
                    return


class ImageHead:
    def __init__(self, pipe: Any, *, config: ImageHeadConfig | None = None, name: str = "image") -> None:
        config = config or ImageHeadConfig()
        self.pipe = pipe
        self.config = config
        self.limits: ImageLimits = image_limits(pipe, config)
        self._runner = DiffusersRunner(pipe, preview_max_side=config.preview_max_side)
        self._batcher = ImageBatcher(
            self._runner.run,
            window_s=config.batch_window_s,  # type: ignore[arg-type]
            max_images=config.max_batch_images,
            name=f"{name}-denoise",
        )

    @classmethod
    def load(cls, path: str | Path, *, device: str = "auto", config: ImageHeadConfig | None = None) -> ImageHead:
        dev, dtype = select_device(device)
        return cls(load_pipeline(path, dev, dtype), config=config)

    def resolve(self, prompt: str, options: ImageOutputOptions) -> ImageJobSpec:
        return resolve_job(prompt, options, self.limits)

    async def generate(
        self, prompt: str, options: ImageOutputOptions, cancel: CancelFlag | None = None
    ) -> AsyncIterator[ImagePartial | ImageFinal]:
        """Previews and final images of one request. Raises ``ImageRequestError`` (an ``InvalidInput``) for
        options the model cannot honour, before any output, and ``ImageGenerationError`` if denoising fails."""
        spec = self.resolve(prompt, options)
        job = _StreamJob(
            spec,
            cancel if cancel is not None else threading.Event(),
            asyncio.get_running_loop(),
            self.config.queue_size,
        )
        self._batcher.submit(job)
        try:
            while True:
                try:
                    item = await asyncio.wait_for(job.queue.get(), _POLL_S)
                except TimeoutError:
                    if job.is_cancelled():
                        return
                    continue
                if item is _END:
                    return
                if isinstance(item, _Failed):
                    raise ImageGenerationError(f"image generation failed: {item.error}") from item.error
                if job.is_cancelled():  # images queued before the cancel are dropped, not sent
                    return
                yield await asyncio.to_thread(cast(RawImage, item).to_chunk)
        finally:
            job.abandon()

    def metrics(self) -> dict[str, float]:
        return self._runner.stats.snapshot()

    def close(self) -> None:
        self._batcher.close(timeout=30)


def load_image_head(path: str | Path, *, device: str = "auto", config: ImageHeadConfig | None = None) -> ImageHead:
    return ImageHead.load(path, device=device, config=config)
