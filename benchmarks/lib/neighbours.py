"""Busy neighbours for a stage under test: what shares the host and the GPU with it in a loaded server.

- ``thread``: in this process, a thread running Python nonstop (it takes the interpreter lock at every
  switch interval) and, on CUDA, a thread running half-precision 8192² matmuls (one CUDA context: the
  kernels of both interleave on the GPU).
- ``process``: another process running the same matmuls on CUDA (a Python loop on a CPU): two CUDA
  contexts, which the GPU time-slices unless MPS runs, as between the engine core and the gateway's stages.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

KINDS = ("none", "thread", "process")


def _python_loop(stop: Any) -> None:
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i


def _matmul_loop(device: str, stop: Any, ready: Any | None = None) -> None:
    import torch

    m = torch.randn(8192, 8192, device=device, dtype=torch.half)
    torch.cuda.synchronize(device)
    if ready is not None:
        ready.set()
    while not stop.is_set():
        for _ in range(4):
            m @ m
        torch.cuda.synchronize(device)


def _process_main(device: str, stop: Any, ready: Any) -> None:
    if device.startswith("cuda"):
        _matmul_loop(device, stop, ready)
    else:
        ready.set()
        _python_loop(stop)


@contextmanager
def busy_neighbour(device: str, kind: str = "thread") -> Iterator[None]:
    """Run the neighbour ``kind`` (one of ``KINDS``) for the duration of the block."""
    if kind not in KINDS:
        raise ValueError(f"neighbour must be one of {', '.join(KINDS)}; got {kind!r}")
    if kind == "none":
        yield
        return
    if kind == "process":
        context = mp.get_context("spawn")  # a fresh interpreter and CUDA context, never a fork of this one
        stop, ready = context.Event(), context.Event()
        process = context.Process(target=_process_main, args=(device, stop, ready), daemon=True)
        process.start()
        if not ready.wait(120):
            process.kill()
            raise RuntimeError("the neighbour process did not start within 120 s")
        try:
            yield
        finally:
            stop.set()
            process.join(30)
            if process.is_alive():
                process.kill()
        return
    stop_thread = threading.Event()
    threads = [threading.Thread(target=_python_loop, args=(stop_thread,), daemon=True)]
    if device.startswith("cuda"):
        threads.append(threading.Thread(target=_matmul_loop, args=(device, stop_thread), daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    try:
        yield
    finally:
        stop_thread.set()
        for thread in threads:
            thread.join()
