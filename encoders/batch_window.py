"""The batching workers' one waiting rule: block until work is queued, then gather for a short window.

A worker thread (ASR, TTS, VAD) calls ``wait_for_batch`` holding its condition. It returns at once with
whatever is queued when the queue is already full or ``window_s`` is 0 (a lone request waits for nothing
more than the window), and otherwise waits up to ``window_s`` for the batch to fill: requests that arrive
together share one model call. Producers notify the condition when they queue work or close.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def wait_for_batch(
    ready: threading.Condition, queued: Callable[[], int], closed: Callable[[], bool], max_batch: int, window_s: float
) -> bool:
    """Wait (``ready`` held) until work is queued and the window has passed or the batch is full; False when
    the worker is closed and nothing is left to do."""
    while not queued() and not closed():
        ready.wait()
    if not queued():
        return False
    deadline = time.monotonic() + window_s
    while queued() < max_batch and not closed():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready.wait(left)
    return True
