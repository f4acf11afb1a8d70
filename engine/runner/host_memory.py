"""Heap pages freed at load time, given back to the operating system.

Loading decodes every tensor of a checkpoint and then drops the ones the runner merged or converted (q/k/v,
gate/up): tens of MiB that glibc keeps in its arenas for reuse, resident for as long as the process idles.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def return_free_heap() -> None:
    """``malloc_trim(0)`` where the C library has it (glibc); nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError as exc:
        log.debug("no C library to trim the heap with: %s", exc)
        return None
