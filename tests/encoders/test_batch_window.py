"""The batching workers' waiting rule: block for work, then gather for a window unless the batch is full."""

from __future__ import annotations

import threading
import time

from omni_gateway.encoders.batch_window import wait_for_batch


def test_closed_and_empty_ends_the_worker() -> None:
    ready = threading.Condition()
    with ready:
        assert wait_for_batch(ready, lambda: 0, lambda: True, 4, 1.0) is False


def test_a_full_batch_goes_at_once_and_a_partial_one_waits_out_the_window() -> None:
    ready = threading.Condition()
    with ready:
        began = time.monotonic()
        assert wait_for_batch(ready, lambda: 4, lambda: False, 4, 5.0)
        assert time.monotonic() - began < 1.0
        began = time.monotonic()
        assert wait_for_batch(ready, lambda: 1, lambda: False, 4, 0.05)
        assert time.monotonic() - began >= 0.05


def test_work_queued_later_wakes_the_worker_and_fills_the_batch() -> None:
    ready = threading.Condition()
    queue: list[int] = []

    def produce() -> None:
        for item in range(3):
            time.sleep(0.02)
            with ready:
                queue.append(item)
                ready.notify()

    producer = threading.Thread(target=produce)
    producer.start()
    with ready:
        began = time.monotonic()
        assert wait_for_batch(ready, lambda: len(queue), lambda: False, 3, 10.0)
        assert len(queue) == 3 and time.monotonic() - began < 5.0  # full before the window ran out
    producer.join()
