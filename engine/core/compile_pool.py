"""A few threads that compile constraints, where a compile nobody waits for any more stops holding a slot.

A compile cannot be interrupted once started (xgrammar's compiler runs in C++, without the GIL), so a
slow one would hold its thread until it ends. Every caller gets its own future: cancelling it (the
request was aborted, its client left, its compile budget ran out) withdraws that caller. A job whose
callers all withdrew is dropped when it has not started; when it has, it runs on, but its thread no longer
counts against ``workers``, so the next job starts at once. Such abandoned threads are bounded too
(``max_abandoned``), so a flood of withdrawn compiles cannot start threads without end.

Jobs with the same key share one compile. Pool threads may run at a lower OS priority (``niceness``), so
that on a machine with few cores, compiles take what the decode loop leaves rather than the reverse.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Job(Generic[V]):
    __slots__ = ("waiters", "started", "abandoned")

    def __init__(self) -> None:
        self.waiters: list[concurrent.futures.Future[V]] = []
        self.started = False
        self.abandoned = False


class CompilePool(Generic[K, V]):
    """Runs ``work(key)`` on up to ``workers`` threads at once for the jobs someone still waits for."""

    def __init__(
        self,
        work: Callable[[K], V],
        *,
        workers: int,
        max_abandoned: int | None = None,
        niceness: int = 0,
        name: str = "compile",
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._work = work
        self._workers = workers
        self._max_abandoned = 4 * workers if max_abandoned is None else max_abandoned
        self._niceness = niceness
        self._name = name
        self._lock = threading.Lock()
        self._jobs: dict[K, _Job[V]] = {}
        self._queue: deque[K] = deque()
        self._busy = 0  # threads running a job someone waits for
        self._abandoned = 0  # threads running a job nobody waits for any more

    def submit(self, key: K) -> concurrent.futures.Future[V]:
        """A future of ``work(key)``; cancel it to withdraw (it never runs, so it can always be cancelled)."""
        waiter: concurrent.futures.Future[V] = concurrent.futures.Future()
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = _Job()
                self._queue.append(key)
            job.waiters.append(waiter)
            start = self._take_slot_locked()
        waiter.add_done_callback(lambda f: self._withdraw(key, f) if f.cancelled() else None)
        if start:
            self._start_thread()
        return waiter

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"queued": len(self._queue), "busy": self._busy, "abandoned": self._abandoned}

    def _take_slot_locked(self) -> bool:
        if self._queue and self._busy < self._workers:
            self._busy += 1
            return True
        return False

    def _start_thread(self) -> None:
        # Not a daemon: the interpreter's exit waits for a compile under way (the limits keep it short) rather
        # than pulling the runtime from under the compiler's native threads, which aborts the process.
        threading.Thread(target=self._serve, name=self._name, daemon=False).start()

    def _withdraw(self, key: K, waiter: concurrent.futures.Future[V]) -> None:
        start = False
        with self._lock:
            job = self._jobs.get(key)
            if job is None or waiter not in job.waiters:
                return
            job.waiters.remove(waiter)
            if job.waiters:
                return
            if not job.started:
                del self._jobs[key]
                self._queue.remove(key)
            elif not job.abandoned and self._abandoned < self._max_abandoned:
                # Its thread runs on, outside the count, and another job may start in its place.
                job.abandoned = True
                self._busy -= 1
                self._abandoned += 1
                start = self._take_slot_locked()
        if start:
            self._start_thread()

    def _serve(self) -> None:
        if self._niceness and hasattr(os, "setpriority"):
            with contextlib.suppress(OSError):  # Linux: a thread's own nice value; elsewhere the process's
                me = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + self._niceness)
        while True:
            with self._lock:
                if not self._queue:
                    self._busy -= 1
                    return
                key = self._queue.popleft()
                job = self._jobs[key]
                job.started = True
            try:
                value = self._work(key)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiter
                error: BaseException | None = exc
            else:
                error = None
            with self._lock:
                del self._jobs[key]
                waiters, abandoned = job.waiters, job.abandoned
                if abandoned:
                    self._abandoned -= 1
            for waiter in waiters:
                if waiter.set_running_or_notify_cancel():
                    if error is None:
                        waiter.set_result(value)
                    else:
                        waiter.set_exception(error)
            if abandoned:
                # This thread was replaced when its job was abandoned; the replacement serves the queue.
                return
