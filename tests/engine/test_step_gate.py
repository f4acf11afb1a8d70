"""engine.runner.step_gate: engine steps wait while an urgent call runs, at most the cap."""

from __future__ import annotations

import threading
import time

from omni_gateway.engine.runner.step_gate import urgent, wait_for_urgent


def test_a_step_waits_until_every_urgent_call_ends() -> None:
    released = threading.Event()
    waited: list[tuple[bool, bool]] = []

    def step() -> None:
        ok = wait_for_urgent(5.0)
        waited.append((ok, released.is_set()))

    with urgent():
        with urgent():  # a second call at once: the step waits for both
            thread = threading.Thread(target=step)
            thread.start()
            time.sleep(0.05)
            assert waited == []
        time.sleep(0.05)
        assert waited == []  # one call still runs
        released.set()
    thread.join(5.0)
    assert waited == [(True, True)]
    assert wait_for_urgent(0.0)


def test_a_wait_is_capped_and_says_so() -> None:
    with urgent():
        began = time.perf_counter()
        assert wait_for_urgent(0.05) is False
        assert time.perf_counter() - began >= 0.05
    assert wait_for_urgent(0.0) is True


def test_a_call_that_raises_still_releases_the_steps() -> None:
    try:
        with urgent():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert wait_for_urgent(0.0)
