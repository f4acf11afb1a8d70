"""How ``EngineCoreClient``'s cores are started and when a dead one is started again.

After a core dies its client waits a backoff, then starts a new one (a new epoch). A core that served at least
``_STABLE_S`` before dying starts a new count of failures; one that died starting, or soon after a restart,
continues the crash loop's, and past ``max_restarts`` in a row the client gives up: a core that cannot start
will not by retrying.
"""

from __future__ import annotations

from typing import Protocol

from omni_gateway.engine.frontend.core_process import CoreSpec

WATCH_S = 0.1  # how often the receiver checks that the core is alive
_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
_STABLE_S = 60.0  # a core that served this long before dying was not crash-looping


class CoreHandle(Protocol):
    """One started core (a local process or a Ray actor)."""

    def exit_reason(self) -> str | None:
        """None while the core runs; why it ended otherwise."""
        ...

    def kill(self) -> None: ...

    def join(self, timeout: float) -> bool: ...


class Launcher(Protocol):
    """Starts cores; ``host`` is the address cores reach this process at (None: same machine, ``ipc://``)."""

    host: str | None

    def start(self, spec: CoreSpec) -> CoreHandle: ...

    def close(self) -> None: ...


def plan_restart(
    failures: int, *, served_s: float | None, ever_ready: bool, max_restarts: int
) -> tuple[int, bool, float]:
    """What follows a core's death: the failures in a row (this one included), whether to give up, and the
    delay until the next start. ``served_s``: how long the core had served, None if it never did."""
    served = served_s is not None and served_s >= _STABLE_S
    failures = 1 if served or failures == 0 else failures + 1
    give_up = not ever_ready or failures > max_restarts
    return failures, give_up, _BACKOFF_S[min(failures, len(_BACKOFF_S)) - 1]
