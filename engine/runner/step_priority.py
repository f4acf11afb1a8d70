"""Two engines of one process that queue their kernels on one CUDA stream, where one engine's prefills
should not wait behind the other's steps: a speaking model's talker beside its thinker.

A talker prefill is several hundred kernel launches from its loop thread, about 3 ms of device work
for 8 sessions that took 17-36 ms to launch beside a thinker stepping nonstop: its kernels went out
between the thinker's steps, and each launch, which lets go of the interpreter lock, waited to take it
back while the thinker's loop (and the event loop its deltas feed) ran Python. While the preferred
engine runs a step that admits requests with input streams (the talker's prefill of the sessions a
thinker step started), the other holds its next step, at most ``HOLD_MAX_S``: the step it launched
ahead still runs, then the prefill, back to back (docs/benchmarks.md, "Speech from Qwen2.5-Omni-7B
shapes"; the A/B runs are in benchmarks/results/omni_speech.jsonl). No torch here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

# A held engine steps again after this long whatever the preferred one is doing: a long prefill delays
# the other engine's requests by at most this much.
HOLD_MAX_S = 0.05


class StepPriority:
    """Shared by a preferred engine's loop (``admitting``) and a yielding one's (``wait_turn``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._admitting = 0

    @contextlib.contextmanager
    def admitting(self) -> Iterator[None]:
        """Around a preferred engine's admitting step: the yielding engine holds meanwhile."""
        with self._cond:
            self._admitting += 1
        try:
            yield
        finally:
            with self._cond:
                self._admitting -= 1
                self._cond.notify_all()

    def wait_turn(self, timeout: float = HOLD_MAX_S) -> bool:
        """Before a yielding engine's step: wait until no preferred step admits requests, at most
        ``timeout`` seconds. False when it gave up waiting."""
        with self._cond:
            return self._cond.wait_for(lambda: self._admitting == 0, timeout)
