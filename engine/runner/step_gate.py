"""Engine steps that stand aside while a more urgent device call of the process runs.

A speaking model's first audio waits on a token2wav call of a few dozen graphed milliseconds. The engines
stepping beside it (7B-class matrix products, one after another) take half the GPU from it: on an H100 at
8 sessions the call took 87 ms beside them instead of 40 ms alone, though its stream has the higher
priority (most likely each of its small dependent kernels finds the multiprocessors full of the engines'
blocks). So the call holds ``urgent()`` and every engine of the process waits in
``wait_for_urgent()`` before launching its next step; steps already launched finish. A wait is capped, so
back-to-back urgent calls cannot starve the engines. The ASR batcher holds it too, where the loader asks
(``OmniConfig.asr_batches_alone``): a voice turn's reply waits on its transcript.

This is process-wide, as the device is: engines in other processes are not held.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

MAX_WAIT_S = 0.25  # longer than a first chunk's call, even at 32 rows

_lock = threading.Condition()
_holders = 0


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """Hold engine steps back until the body returns (nested and concurrent holds add up)."""
    global _holders
    with _lock:
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                _lock.notify_all()


def wait_for_urgent(timeout_s: float = MAX_WAIT_S) -> bool:
    """Wait while an urgent call runs, at most ``timeout_s``; False when the wait ran out."""
    with _lock:
        return _lock.wait_for(lambda: _holders == 0, timeout_s)
