"""The CUDA stream an engine's steps run on, when its config names a priority.

By default every engine step runs on the thread's current stream (the device's default stream), beside
whatever other heads of the process launch on streams of their own: a speaking model's token2wav calls,
whose large kernels hold the GPU's multiprocessors while they run, and every engine kernel queued behind
them waits (H100, 32 sessions: engine steps of 5-10 ms took 50-70 ms while a first chunk ran). A stream of
higher priority gets its blocks scheduled first as multiprocessors free up.

``step_stream(device, priority)`` is one stream per device and priority for the whole process, so a
thinker and its talker step on the same stream (their hand-off of hidden states stays in stream order).
``on_step_stream`` runs a step there without changing what other threads see: the stream first waits for
the work already queued on the caller's current stream (inputs made there: media embeddings, the talker's
rows), and the caller's stream then waits for the step, so work queued there afterwards sees its outputs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch


def step_stream(device: torch.device, priority: int) -> torch.cuda.Stream:
    """The process's step stream of ``priority`` on ``device`` (lower is sooner; torch maps values past
    the device's range to its nearest end). "cuda" and "cuda:N" of the current device get the same one."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _stream(index, priority)


@functools.cache
def _stream(index: int, priority: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=torch.device("cuda", index), priority=priority)


@contextlib.contextmanager
def on_step_stream(stream: torch.cuda.Stream | None) -> Iterator[None]:
    """Run the body on ``stream`` (None: on the current stream, as is), ordered after the work already
    queued on the current stream and before the work queued there next."""
    if stream is None:
        yield
        return
    caller = torch.cuda.current_stream(stream.device)
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        caller.wait_stream(stream)
