"""Worker threads ("lanes") that run many sessions' token2wav calls as batched calls.

Each caller blocks on its own job. A free lane takes every job queued under one ``key`` (calls whose
tensors stack: same window, same reference mel length) as one batched call; there is no waiting window, so
a lone session pays nothing. Urgent groups (a stream's first chunk: the audio a listener is waiting for) go
before the others, however long those have queued. Under load, jobs queue while the lanes are busy and the
next batch is larger, which is what keeps 32 sessions' chunks from running one by one.

With more than one lane, lane 0 takes urgent groups only: a first chunk then waits for no other session's
later chunk (a large call), only for another first chunk's call, and not even that while another lane is
free. Each lane calls ``fn`` with its index, so it can keep its own CUDA stream and graphs.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Hashable
from typing import Any

BatchFn = Callable[[list[tuple[Any, ...]], int], list[Any]]
_Member = tuple[tuple[Any, ...], "concurrent.futures.Future[Any]"]


class BatchedCalls:
    def __init__(self, fn: BatchFn, name: str, max_batch: int = 64, lanes: int = 1) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self._fn = fn
        self._max_batch = max_batch
        self._lanes = lanes
        self._cond = threading.Condition()
        # key -> (urgent, jobs), in the order each key first arrived
        self._pending: dict[Hashable, tuple[bool, list[_Member]]] = {}
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, args=(lane,), name=f"{name}-{lane}", daemon=True)
            for lane in range(lanes)
        ]
        for thread in self._threads:
            thread.start()

    def __call__(self, key: Hashable, *args: Any, urgent: bool = False) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("the token2wav workers are stopped")
            self._pending.setdefault(key, (urgent, []))[1].append((args, future))
            self._cond.notify_all()
        return future.result()

    @property
    def queued(self) -> int:
        """Jobs waiting for a lane."""
        with self._cond:
            return sum(len(members) for _, members in self._pending.values())

    def close(self) -> None:
        """Stop taking jobs; the lanes finish what is queued, then end."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    def _run(self, lane: int) -> None:
        while True:
            with self._cond:
                batch = self._take(lane)
                while batch is None:
                    if self._stopping:
                        return  # nothing left this lane may take
                    self._cond.wait()
                    batch = self._take(lane)
            try:
                results = self._fn([args for args, _ in batch], lane)
            except BaseException as exc:  # noqa: BLE001 - each caller gets the failure of its batch
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                future.set_result(result)

    def _take(self, lane: int) -> list[_Member] | None:
        """The next batch ``lane`` may run (the caller holds the lock): the first urgent group, else (not on
        lane 0 of several) the group that arrived first."""
        key = next((k for k, (urgent, _) in self._pending.items() if urgent), None)
        if key is None and (lane > 0 or self._lanes == 1):
            key = next(iter(self._pending), None)
        if key is None:
            return None
        urgent, members = self._pending.pop(key)
        batch, rest = members[: self._max_batch], members[self._max_batch :]
        if rest:
            self._pending[key] = (urgent, rest)
        return batch
