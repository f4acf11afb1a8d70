"""A server-wide budget of decoded media pixels: what all requests together may hold at once.

A small compressed image can declare a huge canvas, so memory is reserved from the declared size
before decoding and given back once the pixels are gone (the vision tower consumed them, or decoding
failed). A request that finds the budget full waits its turn (first come, first served, so a large
image is not starved by small ones) for at most ``wait_s``, then is refused; nothing is decoded
while it waits.

Waiting happens on the asyncio loop, never in a worker thread (a blocked worker would starve the
other stages that share the executor). Reservations may be released from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field


class BudgetTimeout(TimeoutError):
    """The budget stayed full for the whole wait; the message is safe to show to the client."""


@dataclass(eq=False, slots=True)
class _Waiter:
    amount: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    granted: bool = False


class Reservation:
    """Pixels held against a budget until ``release`` (idempotent, callable from any thread)."""

    __slots__ = ("_budget", "amount", "_released")

    def __init__(self, budget: PixelBudget, amount: int) -> None:
        self._budget = budget
        self.amount = amount
        self._released = False

    def release(self) -> None:
        self._budget._give_back(self)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(eq=False)
class PixelBudget:
    capacity: int  # pixels held at once by every request together
    wait_s: float = 10.0  # how long a request waits for room before it is refused
    _used: int = field(default=0, init=False)
    _waiters: deque[_Waiter] = field(default_factory=deque, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.wait_s < 0:
            raise ValueError(
                f"a pixel budget needs capacity >= 1 and wait_s >= 0, got {self.capacity} and {self.wait_s}"
            )

    @property
    def in_use(self) -> int:
        return self._used

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def reserve(self, amount: int) -> Reservation:
        """Hold ``amount`` pixels, waiting up to ``wait_s`` for room; ``BudgetTimeout`` when none came.
        Cancelled while waiting, it holds nothing."""
        if not 0 <= amount <= self.capacity:
            raise ValueError(f"cannot reserve {amount} pixels from a budget of {self.capacity}")
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._waiters and self._used + amount <= self.capacity:
                self._used += amount
                return Reservation(self, amount)
            waiter = _Waiter(amount, loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.wait_s):
                await waiter.future
        except BaseException as exc:
            with self._lock:
                if waiter.granted:  # granted just as the wait ended: give it straight back
                    self._used -= amount
                else:
                    self._waiters.remove(waiter)
                self._grant_locked()  # the next in line may fit now that this one left the queue
            if isinstance(exc, TimeoutError):
                raise BudgetTimeout(
                    f"the server is decoding {self._used} image pixels for other requests and "
                    f"{amount} more do not fit its budget of {self.capacity}; try again "
                    "shortly"
                ) from None
            raise
        return Reservation(self, amount)

    def _give_back(self, reservation: Reservation) -> None:
        with self._lock:
            if reservation._released:
                return
            reservation._released = True
            self._used -= reservation.amount
            self._grant_locked()

    def _grant_locked(self) -> None:
        while self._waiters and self._used + self._waiters[0].amount <= self.capacity:
            waiter = self._waiters.popleft()
            self._used += waiter.amount
            waiter.granted = True
            try:
                waiter.loop.call_soon_threadsafe(_wake, waiter.future)
            except RuntimeError:  # its loop is closed: nobody is left to use the grant
                self._used -= waiter.amount


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
