"""A speech head's calls replayed from CUDA graphs, one graph per batch-size bucket and shape.

A small call of a speech head is bound by the host, not the GPU: a token2wav window's ODE is up to 40 DiT
evaluations of about 800 operations each, a VITS model pass a few thousand operations, every one launched
from Python (0.6-0.7 s for token2wav's first chunk on an H200, eagerly; a replayed graph takes 0.15 s). On a
busy server the host is shared too: the launches wait for the interpreter lock and for room in the
driver's command queue. A replayed graph launches them all at once.

The heads capture their graphs before they serve, and then ``frozen`` stops captures: a capture while other
threads use the device (the engines' sampling, any work on the legacy stream) can break their work and the
capture. A batch is padded to its bucket with copies of its first row. Where a capture fails that set of
graphs is switched off and its calls run eagerly from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

import torch

log = logging.getLogger(__name__)

Output = torch.Tensor | tuple[torch.Tensor, ...]
Fn = Callable[..., Output]
BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class CallGraphs:
    """Graphs of one kind of call (``name``: "token2wav ODE", "VITS flow"), keyed by bucket, ``key`` and input
    shapes. The call returns a tensor or a tuple of tensors, batch first like its inputs."""

    def __init__(self, name: str, buckets: tuple[int, ...] = BUCKETS, max_graphs: int = 128) -> None:
        self.name = name
        self._buckets = buckets
        self._max_graphs = max_graphs
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], Output]] = {}
        self._pool: object | None = None
        self._capture_stream: torch.cuda.Stream | None = None
        self._side_stream: torch.cuda.Stream | None = None
        self.enabled = True
        self.replayed = 0  # calls served from a graph
        self.frozen = False  # set once the head is built: from then on a call without a graph runs eagerly

    def __len__(self) -> int:
        return len(self._graphs)

    def __call__(self, fn: Fn, key: Hashable, *inputs: torch.Tensor) -> Output | None:
        """``fn(*inputs)`` (batch first in every input and the output) from its graph, or None where no graph
        serves this call. ``key`` names what ``fn`` computes beyond the inputs' shapes (e.g. its ODE steps)."""
        batch = inputs[0].shape[0]
        bucket = next((b for b in self._buckets if b >= batch), None)
        if not self.enabled or bucket is None:
            return None
        full_key = (bucket, key, tuple(tuple(v.shape[1:]) for v in inputs))
        captured = self._graphs.get(full_key)
        if captured is None:
            if self.frozen or len(self._graphs) >= self._max_graphs:
                return None
            try:
                captured = self._capture(fn, bucket, inputs)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
                log.warning("CUDA graph capture of the %s failed (%s); it runs eagerly", self.name, exc)
                self.enabled = False
                return None
            self._graphs[full_key] = captured
        graph, static_inputs, output = captured
        for static, value in zip(static_inputs, inputs):
            static[:batch].copy_(value)
            if batch < bucket:
                static[batch:].copy_(value[:1].expand(bucket - batch, *value.shape[1:]))
        graph.replay()
        self.replayed += 1
        if isinstance(output, tuple):
            return tuple(o[:batch].clone() for o in output)
        return output[:batch].clone()

    def _capture(
        self, fn: Fn, bucket: int, inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], Output]:
        static = tuple(v[:1].expand(bucket, *v.shape[1:]).clone() for v in inputs)
        device = inputs[0].device
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            # Its own capture stream, not torch's shared default one: a kernel captured on a stream keeps
            # the cuBLAS workspace of that stream, so graphs captured on one stream (the engines' decode
            # graphs too) would all write one workspace when they replay at once from different threads.
            self._capture_stream = torch.cuda.Stream(device=inputs[0].device)
            # One for every capture: torch's pool hands out 32 streams a priority in turn, and a stream per
            # capture would cycle it until another graph set's capture stream, or an engine's, is this one's.
            self._side_stream = torch.cuda.Stream(device=device)
        side = self._side_stream
        assert side is not None
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # first-call work (kernel selection, lazy init) stays out of the capture
            fn(*static)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=self._capture_stream, capture_error_mode="thread_local"):
            output = fn(*static)
        torch.cuda.current_stream(device).synchronize()
        log.debug("captured the %s for %d rows of %s", self.name, bucket, tuple(static[0].shape[1:]))
        return graph, static, output
