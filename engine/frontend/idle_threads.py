"""Idle worker threads that sleep at once: the OpenMP setting of a server whose models share the cores.

OpenMP runtimes keep a parallel region's workers spinning for a while after it ends (libgomp, which torch
uses and CTranslate2 ships a copy of, spins about 300,000 iterations by default), betting that the next
region comes soon. In a voice server the next work on those cores is usually another library's (the
engine's own C kernels, Whisper, Piper, Smart Turn), which the spinners then slow down. On 2 cores a
5-token prefill after a cached prompt took 59 ms with spinning workers and 22 ms with sleeping ones, and a
decode step 6.2 against 5.2 ms. The runtimes read the setting once, when they load, so it is set before
any model library is imported; a value the user exported is kept.
"""

from __future__ import annotations

import logging
import os
import sys

SLEEPING_WORKERS = {"OMP_WAIT_POLICY": "PASSIVE"}

log = logging.getLogger(__name__)


def sleep_idle_workers() -> None:
    """Ask the OpenMP runtimes loaded from now on, in this process and its children, to let idle workers
    sleep (unless the environment already says otherwise)."""
    for key, value in SLEEPING_WORKERS.items():
        os.environ.setdefault(key, value)
    loaded = [name for name in ("torch", "ctranslate2") if name in sys.modules]
    if loaded:
        log.debug("%s already loaded: its OpenMP workers keep their wait policy in this process", loaded)
