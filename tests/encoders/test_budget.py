"""The server-wide pixel budget: reservations, first-come waits, bounded waits, nothing leaked."""

from __future__ import annotations

import asyncio
import threading

import pytest
from omni_gateway.encoders.budget import BudgetTimeout, PixelBudget


def test_reserve_and_release_within_capacity() -> None:
    budget = PixelBudget(100, wait_s=0)

    async def main() -> None:
        a = await budget.reserve(60)
        b = await budget.reserve(40)
        assert budget.in_use == 100
        a.release()
        a.release()  # idempotent: released twice, counted once
        assert budget.in_use == 40
        with b:
            pass
        assert budget.in_use == 0

    asyncio.run(main())


def test_a_request_over_the_whole_capacity_is_refused_at_once() -> None:
    budget = PixelBudget(100)
    with pytest.raises(ValueError, match="cannot reserve 101 pixels from a budget of 100"):
        asyncio.run(budget.reserve(101))
    assert budget.in_use == 0


def test_a_full_budget_refuses_after_the_wait_and_holds_nothing() -> None:
    budget = PixelBudget(100, wait_s=0.05)

    async def main() -> None:
        held = await budget.reserve(80)
        with pytest.raises(BudgetTimeout, match="80 image pixels for other requests and 30 more"):
            await budget.reserve(30)
        assert (budget.in_use, budget.waiting) == (80, 0)
        held.release()

    asyncio.run(main())
    assert budget.in_use == 0


def test_waiters_are_served_in_arrival_order_when_room_frees() -> None:
    budget = PixelBudget(100, wait_s=30)
    order: list[str] = []

    async def take(name: str, amount: int) -> None:
        reservation = await budget.reserve(amount)
        order.append(name)
        reservation.release()

    async def main() -> None:
        held = await budget.reserve(90)
        big = asyncio.create_task(take("big", 100))
        await asyncio.sleep(0)
        small = asyncio.create_task(take("small", 5))  # would fit now, but must not overtake the big one
        await asyncio.sleep(0)
        assert budget.waiting == 2 and order == []
        held.release()
        await asyncio.gather(big, small)

    asyncio.run(main())
    assert order == ["big", "small"] and budget.in_use == 0


def test_a_release_from_a_worker_thread_wakes_the_waiter() -> None:
    budget = PixelBudget(10, wait_s=30)

    async def main() -> None:
        held = await budget.reserve(10)
        waiter = asyncio.create_task(budget.reserve(10))
        await asyncio.sleep(0)
        thread = threading.Thread(target=held.release)
        thread.start()
        got = await waiter
        thread.join()
        assert budget.in_use == 10
        got.release()

    asyncio.run(main())
    assert budget.in_use == 0


def test_a_waiter_cancelled_holds_nothing_and_lets_the_next_in() -> None:
    budget = PixelBudget(10, wait_s=30)

    async def main() -> None:
        held = await budget.reserve(6)
        first = asyncio.create_task(budget.reserve(10))
        await asyncio.sleep(0)
        second = asyncio.create_task(budget.reserve(4))  # fits, but queued behind the first
        await asyncio.sleep(0)
        first.cancel()
        got = await second
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (budget.in_use, budget.waiting) == (10, 0)
        got.release()
        held.release()

    asyncio.run(main())
    assert budget.in_use == 0


def test_a_grant_that_lands_as_the_wait_is_cancelled_is_given_back() -> None:
    budget = PixelBudget(10, wait_s=30)

    async def main() -> None:
        held = await budget.reserve(10)
        waiter = asyncio.create_task(budget.reserve(10))
        await asyncio.sleep(0)
        held.release()  # grants the waiter; its task has not run yet
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(main())
    assert (budget.in_use, budget.waiting) == (0, 0)


@pytest.mark.parametrize("capacity, wait_s", [(0, 1.0), (10, -1.0)])
def test_bad_settings_are_refused(capacity: int, wait_s: float) -> None:
    with pytest.raises(ValueError, match="capacity >= 1 and wait_s >= 0"):
        PixelBudget(capacity, wait_s)
