"""Whisper's encoder replayed from CUDA graphs, one per batch bucket.

An eager encoder pass of Whisper large-v3-turbo is some 600 kernel launches issued from Python (32 layers).
In a server whose interpreter also runs the event loop and the TTS worker, every launch may wait for the
interpreter lock, so a pass that takes tens of milliseconds alone took several hundred beside them (the
same as the VITS head's passes did before they were replayed from graphs). A replay is one launch.

A batch's rows are independent in the encoder (convolutions, layer norms and attention all stay inside a
row), so a batch is padded up to a bucket (1, 2, 3, 4, 6, 8, ... rows: at most a third of a pass spent on
padding, where powers of two would waste up to half of a compute-bound pass); the padding rows hold
whatever an earlier batch left there and are never read. Every bucket reads its input from the first rows
of one static buffer, and all graphs share one memory pool.

Every graph is captured when the recognizer is built, before it serves (as the decoder's are); where a
capture fails the encoder runs eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def capture_or_eager(what: str, capture: Callable[[], None], forget: Callable[[], None]) -> bool:
    """Run ``capture``; where it fails, log why, ``forget`` what it left, and say so (``what`` runs eagerly)."""
    try:
        capture()
    except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
        log.warning("Whisper: CUDA graph capture of %s failed (%s); it runs eagerly", what, exc)
        forget()
        return False
    return True


class GraphedWhisperEncoder:
    """``encoder(features)``: the last hidden state of a ``WhisperEncoder`` in eval mode, for a batch of
    log-mel windows [rows, mel bins, 3000]; replayed from CUDA graphs where ``graphs`` and the encoder is on
    CUDA, else run eagerly. Batches larger than ``max_rows`` run in parts."""

    def __init__(self, encoder: Any, *, max_rows: int, graphs: bool) -> None:
        import torch

        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1; got {max_rows}")
        self._torch = torch
        self.encoder = encoder
        parameter = next(encoder.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.buckets = tuple(b for b in BUCKETS if b < max_rows) + (max_rows,)
        self.frames = 2 * encoder.config.max_source_positions  # the conv stem halves the 3000 frames
        self._input = None
        self._outputs: dict[int, Any] = {}  # bucket rows -> the output its graph writes
        self._graphs: dict[int, Any] = {}
        if graphs and self.device.type == "cuda":
            self._capture_all()

    @property
    def graphs(self) -> bool:
        return bool(self._graphs)

    def __call__(self, features: Any) -> Any:
        if not self._graphs:
            return self.encoder(features).last_hidden_state
        expected = (self.encoder.config.num_mel_bins, self.frames)
        if tuple(features.shape[1:]) != expected:
            shape = list(features.shape)
            raise ValueError(f"Whisper's encoder takes [rows, {expected[0]}, {expected[1]}]; got {shape}")
        most = self.buckets[-1]
        parts = [self._replay(features[start : start + most]) for start in range(0, features.shape[0], most)]
        return parts[0] if len(parts) == 1 else self._torch.cat(parts)

    def _replay(self, features: Any) -> Any:
        rows = features.shape[0]
        bucket = next(b for b in self.buckets if b >= rows)
        self._input[:rows].copy_(features)
        self._graphs[bucket].replay()
        # a copy: the next replay of any bucket may reuse this output's memory (one shared pool)
        return self._outputs[bucket][:rows].clone()

    def _capture_all(self) -> None:
        if capture_or_eager("the encoder", lambda: self._capture_each(self._torch), self._forget_graphs):
            log.info("Whisper: captured the encoder for %s rows", ", ".join(map(str, self.buckets)))

    def _forget_graphs(self) -> None:
        self._graphs.clear()
        self._outputs.clear()
        self._input = None

    def _capture_each(self, torch: Any) -> None:
        shape = (self.buckets[-1], self.encoder.config.num_mel_bins, self.frames)
        self._input = torch.zeros(shape, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm up outside the capture (cuDNN plans, cuBLAS workspaces)
                for rows in self.buckets:
                    for _ in range(2):
                        self.encoder(self._input[:rows])
            torch.cuda.current_stream(self.device).wait_stream(stream)
            pool = torch.cuda.graph_pool_handle()
            # largest first: the pool's blocks are sized by the largest pass and reused by the smaller ones
            for rows in reversed(self.buckets):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    self._outputs[rows] = self.encoder(self._input[:rows]).last_hidden_state
                self._graphs[rows] = graph
            torch.cuda.synchronize(self.device)
