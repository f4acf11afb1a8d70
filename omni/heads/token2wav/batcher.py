"""Worker threads ("lanes") that run many sessions' token2wav calls as batched calls.

Each caller blocks on its own job. A free lane takes every job queued under one ``key`` (calls whose
tensors stack: same window, same reference mel length) as one batched call. Sessions that speak together
reach their chunks in the same talker step, but their jobs arrive one at a time (each session's thread
hands its own over), so a lane waits while a key's jobs keep coming: until none has arrived for
``QUIET_S`` (at most ``GATHER_S`` after the first), and a lone session pays ``QUIET_S``. Urgent groups (a
stream's first chunk: the audio a listener is waiting for) go before the others, however long those have
queued. Under load, jobs queue while the lanes are busy and the next batch is larger, which is what keeps
32 sessions' chunks from running one by one.

Past the first chunk, what matters is how soon each listener runs out of audio: a job may carry a
``deadline`` (``time.monotonic()`` seconds: its stream's playback start plus the audio already delivered).
Of the other groups a lane takes the one whose earliest deadline is soonest, and a group of more than
``max_batch`` jobs is cut earliest deadlines first, so a stream about to run dry overtakes streams with
seconds buffered. A job without a deadline counts as due ``NO_DEADLINE_SLACK_S`` after it arrived: it is
never starved, and such jobs alone run in arrival order.

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

QUIET_S = 0.0015  # a key's jobs stop gathering once none has arrived for this long
GATHER_S = 0.005  # ... or this long after its first
NO_DEADLINE_SLACK_S = 1.0  # a job without a deadline is due this long after it arrived


@dataclass(slots=True)
class _Member:
    args: tuple[Any, ...]
    future: concurrent.futures.Future[Any]
    urgent: bool
    due: tuple[float, int]  # (deadline, arrival number): earlier runs first, ties in arrival order

    @property
    def order(self) -> tuple[bool, tuple[float, int]]:
        return not self.urgent, self.due


@dataclass(slots=True)
class _Group:
    first_at: float
    last_at: float
    members: list[_Member] = field(default_factory=list)
    urgent: bool = False  # holds a first chunk
    due: tuple[float, int] = (float("inf"), 0)  # its most pressing member's

    def add(self, member: _Member) -> None:
        self.members.append(member)
        self.urgent = self.urgent or member.urgent
        self.due = min(self.due, member.due)


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
        self._arrivals = 0  # jobs handed over so far: breaks ties between equal deadlines
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, args=(lane,), name=f"{name}-{lane}", daemon=True)
            for lane in range(lanes)
        ]
        for thread in self._threads:
            thread.start()

    def __call__(self, key: Hashable, *args: Any, urgent: bool = False, deadline: float | None = None) -> Any:
        """Run ``fn`` on ``args`` batched with the other jobs of ``key`` and return this job's result.
        ``deadline``: when this job's listener runs out of audio (``time.monotonic()`` seconds), or None."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("the token2wav workers are stopped")
            now = time.monotonic()
            self._arrivals += 1
            due = now + NO_DEADLINE_SLACK_S if deadline is None else deadline
            group = self._pending.setdefault(key, _Group(now, now))
            group.add(_Member(args, future, urgent, (due, self._arrivals)))
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
                batch = self._take(key, lane)
            try:
                results = self._fn([member.args for member in batch], lane)
            except BaseException as exc:  # noqa: BLE001 - each caller gets the failure of its batch
                for member in batch:
                    member.future.set_exception(exc)
                continue
            for member, result in zip(batch, results):
                member.future.set_result(result)

    def _urgent_only(self, lane: int) -> bool:
        return lane == 0 and self._lanes > 1

    def _next_key(self, lane: int) -> Hashable | None:
        """The key ``lane`` may run next (the caller holds the lock): of the urgent groups, else (not on
        lane 0 of several) of all, the one whose most pressing job is due soonest."""
        urgent = [(group.due, key) for key, group in self._pending.items() if group.urgent]
        if urgent:
            return min(urgent, key=lambda entry: entry[0])[1]
        if self._urgent_only(lane) or not self._pending:
            return None
        return min(self._pending.items(), key=lambda item: item[1].due)[0]

    def _gathering(self, group: _Group) -> float:
        """How much longer ``group`` waits for more jobs (0: it runs now)."""
        if self._stopping or len(group.members) >= self._max_batch:
            return 0.0
        return min(group.last_at + QUIET_S, group.first_at + GATHER_S) - time.monotonic()

    def _take(self, key: Hashable, lane: int) -> list[_Member]:
        """The batch of ``key`` that ``lane`` runs: first chunks, then the earliest deadlines, at most
        ``max_batch`` (the first-chunk lane takes first chunks only)."""
        group = self._pending.pop(key)
        members = sorted(group.members, key=lambda member: member.order)
        runnable = [m for m in members if m.urgent] if self._urgent_only(lane) else members
        batch = runnable[: self._max_batch]
        rest = members[len(batch) :]  # sorted: the batch is a prefix of it
        if rest:  # already gathered: runs as soon as a lane is free
            left = _Group(group.first_at, group.last_at)
            for member in rest:
                left.add(member)
            self._pending[key] = left
        return batch
