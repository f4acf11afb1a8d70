"""The DiT's whole ODE for one window length replayed from CUDA graphs, one graph per batch-size bucket.

Streamed token2wav is bound by the host, not the GPU: a window's ODE is 36 DiT evaluations of about 2,200
operations each, every one launched from Python (about 1 s on an H200 whatever the window's length).
A replayed graph launches them all at once. Only the first chunk's window is replayed: it has one length,
so a few graphs (one per batch bucket and reference-mel length) cover every session's first audio; later
chunks' windows vary in length and run eagerly. A graph is captured the first time its shape is needed,
on the token2wav worker thread that makes every DiT call (``token2wav_batcher``), with thread-local
capture so the engine threads' work on the device meanwhile is untouched. A batch is padded to its
bucket with copies of its first row. Where a capture fails the graphs are switched off and the ODE runs
eagerly from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

Ode = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class OdeGraphs:
    def __init__(self, ode: Ode, buckets: tuple[int, ...] = BUCKETS, max_graphs: int = 32) -> None:
        self._ode = ode
        self._buckets = buckets
        self._max_graphs = max_graphs
        # (bucket, codes, reference frames) -> (graph, static inputs, static output)
        self._graphs: dict[
            tuple[int, int, int], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], torch.Tensor]
        ] = {}
        self._pool: object | None = None
        self.enabled = True

    def __call__(
        self, code: torch.Tensor, x0: torch.Tensor, cond: torch.Tensor, ref_mel: torch.Tensor
    ) -> torch.Tensor | None:
        """The ODE's ``[B, mel_dim, frames]`` mel from its graph, or None where no graph serves this call."""
        batch = code.shape[0]
        bucket = next((b for b in self._buckets if b >= batch), None)
        if not self.enabled or bucket is None:
            return None
        key = (bucket, code.shape[1], ref_mel.shape[1])
        captured = self._graphs.get(key)
        if captured is None:
            if len(self._graphs) >= self._max_graphs:
                return None
            try:
                captured = self._capture(bucket, code, x0, cond, ref_mel)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
                log.warning("token2wav: CUDA graph capture failed (%s); the ODE runs eagerly", exc)
                self.enabled = False
                return None
            self._graphs[key] = captured
        graph, inputs, output = captured
        for static, value in zip(inputs, (code, x0, cond, ref_mel)):
            static[:batch].copy_(value)
            if batch < bucket:
                static[batch:].copy_(value[:1].expand(bucket - batch, *value.shape[1:]))
        graph.replay()
        return output[:batch].clone()

    def _capture(
        self, bucket: int, code: torch.Tensor, x0: torch.Tensor, cond: torch.Tensor, ref_mel: torch.Tensor
    ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], torch.Tensor]:
        inputs = tuple(v[:1].expand(bucket, *v.shape[1:]).clone() for v in (code, x0, cond, ref_mel))
        device = code.device
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # first-call work (kernel selection, lazy init) stays out of the capture
            self._ode(*inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            output = self._ode(*inputs)
        torch.cuda.current_stream(device).synchronize()
        log.info("token2wav: captured the first chunk's ODE for %d windows of %d codes", bucket, code.shape[1])
        return graph, inputs, output
