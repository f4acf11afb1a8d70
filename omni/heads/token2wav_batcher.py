"""One worker thread that runs many sessions' token2wav calls as batched calls.

Each caller blocks on its own job; the worker takes every job queued when it wakes (no waiting window,
so a lone session pays nothing), groups them by ``key`` (calls whose tensors stack: same window length,
same reference mel length) and makes one batched call per group. Under load, jobs queue while a batch
runs and the next batch is larger, which is what keeps 32 sessions' chunks from running one by one.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable, Hashable
from typing import Any

BatchFn = Callable[[list[tuple[Any, ...]]], list[Any]]


class BatchedCalls:
    def __init__(self, fn: BatchFn, name: str, max_batch: int = 64) -> None:
        self._fn = fn
        self._max_batch = max_batch
        self._jobs: queue.SimpleQueue[tuple[Hashable, tuple[Any, ...], concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __call__(self, key: Hashable, *args: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((key, args, future))
        return future.result()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            jobs = [first]
            while len(jobs) < self._max_batch:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                jobs.append(job)
            groups: dict[Hashable, list[tuple[tuple[Any, ...], concurrent.futures.Future[Any]]]] = {}
            for key, args, future in jobs:
                groups.setdefault(key, []).append((args, future))
            for members in groups.values():
                try:
                    results = self._fn([args for args, _ in members])
                except BaseException as exc:  # noqa: BLE001 - each caller gets the failure of its batch
                    for _, future in members:
                        future.set_exception(exc)
                    continue
                for (_, future), result in zip(members, results):
                    future.set_result(result)
