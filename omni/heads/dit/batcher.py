"""Groups compatible image requests into one denoising batch. Threads only: no torch, no I/O.

A single worker thread owns the model. It takes the oldest waiting request, then keeps collecting
requests with the same ``batch_key`` for ``window_s`` (or until ``max_images`` is reached) and hands the
group to ``run_batch``. Incompatible requests keep their place in the queue for a later round, so a
lone request waits at most one window longer than it would unbatched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

log = logging.getLogger(__name__)


class BatchItem(Protocol):
    @property
    def batch_key(self) -> Hashable: ...

    @property
    def num_images(self) -> int: ...

    def is_cancelled(self) -> bool: ...

    def finish(self) -> None:
        """No more output will come (sent after the last item, on cancellation, or when skipped)."""
        ...

    def fail(self, error: BaseException) -> None: ...


class BatcherClosed(RuntimeError):
    pass


class ImageBatcher:
    def __init__(
        self,
        run_batch: Callable[[list[BatchItem]], None],
        *,
        window_s: float = 0.01,
        max_images: int = 8,
        name: str = "image-batcher",
    ) -> None:
        if window_s < 0 or max_images < 1:
            raise ValueError(f"need window_s >= 0 and max_images >= 1; got {window_s!r}, {max_images!r}")
        self._run_batch = run_batch
        self._window_s = window_s
        self._max_images = max_images
        self._pending: list[BatchItem] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: BatchItem) -> None:
        with self._cond:
            if self._closed:
                raise BatcherClosed("the image head is shut down")
            self._pending.append(item)
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests; requests still waiting are finished without output."""
        with self._cond:
            self._closed = True
            dropped, self._pending = self._pending, []
            self._cond.notify_all()
        for item in dropped:
            item.finish()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            live = []
            for item in batch:
                if item.is_cancelled():
                    item.finish()
                else:
                    live.append(item)
            if not live:
                continue
            try:
                self._run_batch(live)
            except BaseException as exc:  # the worker must survive a failed batch to serve the next one
                log.exception("image batch of %d request(s) failed", len(live))
                for item in live:
                    item.fail(exc)

    def _next_batch(self) -> list[BatchItem] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            first = self._pending.pop(0)
            batch, images = [first], first.num_images
            deadline = time.monotonic() + self._window_s
            while images < self._max_images:
                images = self._take_compatible(batch, images)
                remaining = deadline - time.monotonic()
                if images >= self._max_images or remaining <= 0 or self._closed:
                    break
                self._cond.wait(remaining)
            return batch

    def _take_compatible(self, batch: list[BatchItem], images: int) -> int:
        key = batch[0].batch_key
        kept = []
        for item in self._pending:
            if item.batch_key == key and images + item.num_images <= self._max_images:
                batch.append(item)
                images += item.num_images
            else:
                kept.append(item)
        self._pending = kept
        return images
