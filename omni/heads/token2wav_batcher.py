"""One worker thread that runs many sessions' token2wav calls as batched calls.

Each caller blocks on its own job. The worker gathers every job queued (no waiting window, so a lone
session pays nothing), groups them by ``key`` (calls whose tensors stack: same window, same reference
mel length) and makes one batched call for one group, then gathers again. Urgent groups (a stream's first
chunk: the audio a listener is waiting for) go before the others, however long those have queued, so a
session's first audio never waits behind other sessions' later chunks for more than the call in progress.
Under load, jobs queue while a batch runs and the next batch is larger, which is what keeps 32 sessions'
chunks from running one by one.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable, Hashable
from typing import Any

BatchFn = Callable[[list[tuple[Any, ...]]], list[Any]]
_Job = tuple[Hashable, bool, tuple[Any, ...], "concurrent.futures.Future[Any]"]


class BatchedCalls:
    def __init__(self, fn: BatchFn, name: str, max_batch: int = 64) -> None:
        self._fn = fn
        self._max_batch = max_batch
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __call__(self, key: Hashable, *args: Any, urgent: bool = False) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((key, urgent, args, future))
        return future.result()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        # key -> (urgent, jobs), in the order each key first arrived
        pending: dict[Hashable, tuple[bool, list[tuple[tuple[Any, ...], concurrent.futures.Future[Any]]]]] = {}
        stopping = False
        while True:
            if not stopping:
                stopping = self._gather(pending, block=not pending)
            if not pending:
                return  # stopping, nothing left
            key = next((k for k, (urgent, _) in pending.items() if urgent), next(iter(pending)))
            urgent, members = pending.pop(key)
            batch, rest = members[: self._max_batch], members[self._max_batch :]
            if rest:
                pending[key] = (urgent, rest)
            try:
                results = self._fn([args for args, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - each caller gets the failure of its batch
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                future.set_result(result)

    def _gather(
        self,
        pending: dict[Hashable, tuple[bool, list[tuple[tuple[Any, ...], concurrent.futures.Future[Any]]]]],
        *,
        block: bool,
    ) -> bool:
        """Move the queued jobs into ``pending`` (waiting for one if ``block``); True once ``close`` was called."""
        while True:
            try:
                job = self._jobs.get() if block else self._jobs.get_nowait()
            except queue.Empty:
                return False
            block = False
            if job is None:
                return True
            key, urgent, args, future = job
            group = pending.setdefault(key, (urgent, []))
            group[1].append((args, future))
