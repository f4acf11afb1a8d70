"""Worker threads ("lanes") that run many sessions' token2wav calls as batched calls.

Each caller blocks on its own job. A free lane takes every job queued under one ``key`` (calls whose
tensors stack: same window, same reference mel length) as one batched call. Sessions that speak together
reach their chunks in the same talker step, but their jobs arrive one at a time (each session's thread
hands its own over), so a lane waits while a key's jobs keep coming: until none has arrived for
``QUIET_S`` (at most ``GATHER_S`` after the first), and a lone session pays ``QUIET_S``. Urgent groups (a
stream's first chunk: the audio a listener is waiting for) go before the others, however long those have
queued. Under load, jobs queue while the lanes are busy and the next batch is larger, which is what keeps
32 sessions' chunks from running one by one.

With more than one lane, lane 0 takes urgent groups only: a first chunk then waits for no other session's
later chunk (a large call), only for another first chunk's call, and not even that while another lane is
free. Each lane calls ``fn`` with its index, so it can keep its own CUDA stream and graphs.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

BatchFn = Callable[[list[tuple[Any, ...]], int], list[Any]]
_Member = tuple[tuple[Any, ...], "concurrent.futures.Future[Any]"]

QUIET_S = 0.0015  # a key's jobs stop gathering once none has arrived for this long
GATHER_S = 0.005  # ... or this long after its first


@dataclass(slots=True)
class _Group:
    urgent: bool
    first_at: float
    last_at: float
    members: list[_Member] = field(default_factory=list)


class BatchedCalls:
    def __init__(self, fn: BatchFn, name: str, max_batch: int = 64, lanes: int = 1) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self._fn = fn
        self._max_batch = max_batch
        self._lanes = lanes
        self._cond = threading.Condition()
        # key -> its queued jobs, in the order each key first arrived
        self._pending: dict[Hashable, _Group] = {}
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
            now = time.monotonic()
            group = self._pending.setdefault(key, _Group(urgent, now, now))
            group.members.append((args, future))
            group.last_at = now
            self._cond.notify_all()
        return future.result()

    @property
    def queued(self) -> int:
        """Jobs waiting for a lane."""
        with self._cond:
            return sum(len(group.members) for group in self._pending.values())

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
                while True:
                    key = self._next_key(lane)
                    if key is None:
                        if self._stopping:
                            return  # nothing left this lane may take
                        self._cond.wait()
                        continue
                    wait = self._gathering(self._pending[key])
                    if wait <= 0:
                        break
                    self._cond.wait(wait)  # an arrival (or another lane's take) wakes it to look again
                batch = self._take(key)
            try:
                results = self._fn([args for args, _ in batch], lane)
            except BaseException as exc:  # noqa: BLE001 - each caller gets the failure of its batch
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                future.set_result(result)

    def _next_key(self, lane: int) -> Hashable | None:
        """The key ``lane`` may run next (the caller holds the lock): the first urgent group, else (not on
        lane 0 of several) the group that arrived first."""
        key = next((k for k, group in self._pending.items() if group.urgent), None)
        if key is None and (lane > 0 or self._lanes == 1):
            key = next(iter(self._pending), None)
        return key

    def _gathering(self, group: _Group) -> float:
        """How much longer ``group`` waits for more jobs (0: it runs now)."""
        if self._stopping or len(group.members) >= self._max_batch:
            return 0.0
        return min(group.last_at + QUIET_S, group.first_at + GATHER_S) - time.monotonic()

    def _take(self, key: Hashable) -> list[_Member]:
        group = self._pending.pop(key)
        batch, rest = group.members[: self._max_batch], group.members[self._max_batch :]
        if rest:  # already gathered: runs as soon as a lane is free
            self._pending[key] = _Group(group.urgent, group.first_at, group.last_at, rest)
        return batch
