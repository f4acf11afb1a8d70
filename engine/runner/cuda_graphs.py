"""CUDA-graph capture and replay of a model step, one graph per bucket of rows (sequences of a decode
step, tokens of a prefill step).

A step launches hundreds of small kernels; replaying a captured graph removes their per-launch host
cost. A graph replays fixed addresses, so every input lives in a static buffer sized for the largest
bucket: ``replay`` copies the live rows into the leading rows, fills the padding rows with a
per-input pad value (for example slot -1, which the KV write skips, and sequence length 0, which
decode attention answers with zeros), replays the smallest bucket that holds the rows, and returns
the outputs' leading rows. A source may live on the host or on the device, and an input left out of
a replay keeps what it holds. A ``whole`` input (per-sequence metadata of a prefill step, whose size
does not follow the token count) is handed to every bucket's step in full.

The step callable is opaque: it receives the static buffers sliced to the bucket's batch size as
keyword arguments and returns a tensor, a tuple of tensors or a dict of tensors. It must not
synchronize with the host, allocate outside the graph's memory pool or branch on tensor values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch

StepOutput = torch.Tensor | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]


def pick_bucket(buckets: Sequence[int], batch: int) -> int | None:
    """Smallest bucket that holds ``batch`` rows, or None when the batch exceeds every bucket."""
    if batch < 1:
        raise ValueError(f"batch: expected at least 1 row, got {batch}")
    fitting = [b for b in buckets if b >= batch]
    return min(fitting) if fitting else None


def default_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_batch`` (vLLM's spacing)."""
    if max_batch < 1:
        raise ValueError(f"max_batch: expected at least 1, got {max_batch}")
    return sorted({b for b in (1, 2, 4) if b <= max_batch} | set(range(8, max_batch + 1, 8)) | {max_batch})


class _Staged(Protocol):
    copied: torch.cuda.Event | None  # recorded once the copies out of these buffers are queued


_S = TypeVar("_S", bound=_Staged)


class StagingPair(Generic[_S]):
    """Two sets of pinned host buffers for a step's inputs, used in turn: one is packed while the copies out
    of the other, made for the step before, may still be queued. ``claim`` hands out the next set once the
    event its last user recorded in ``copied`` has completed."""

    def __init__(self, make: Callable[[], _S]) -> None:
        self._sets = (make(), make())
        self._turn = 0

    def claim(self) -> _S:
        self._turn ^= 1
        staging = self._sets[self._turn]
        if staging.copied is not None:
            staging.copied.synchronize()
            staging.copied = None
        return staging


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    outputs: StepOutput


class StepGraphs:
    """Capture ``step`` once per bucket over static input buffers, then replay by batch size."""

    def __init__(
        self,
        step: Callable[..., StepOutput],
        static_inputs: Mapping[str, torch.Tensor],
        buckets: Sequence[int],
        pad_values: Mapping[str, float | int | None] | None = None,
        warmup_iters: int = 2,
        whole: Collection[str] = (),
    ) -> None:
        if not static_inputs:
            raise ValueError("static_inputs: expected at least one buffer, got none")
        if not buckets:
            raise ValueError("buckets: expected at least one batch size, got none")
        devices = {t.device for t in static_inputs.values()}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(
                f"static_inputs: expected buffers on one CUDA device, got devices {sorted(map(str, devices))}"
            )
        unknown_whole = set(whole) - set(static_inputs)
        if unknown_whole:
            raise ValueError(f"whole: names {sorted(unknown_whole)} are not static inputs {sorted(static_inputs)}")
        if not set(static_inputs) - set(whole):
            raise ValueError("static_inputs: expected at least one buffer sliced per bucket, got only whole ones")
        capacity = min(t.shape[0] for name, t in static_inputs.items() if name not in whole)
        if max(buckets) > capacity or min(buckets) < 1:
            raise ValueError(
                f"buckets: expected sizes in [1, {capacity}] (the static buffers' rows), got {sorted(buckets)}"
            )
        unknown = set(pad_values or {}) - set(static_inputs)
        if unknown:
            raise ValueError(f"pad_values: names {sorted(unknown)} are not static inputs {sorted(static_inputs)}")
        self._step = step
        self._inputs = dict(static_inputs)
        self._whole = frozenset(whole)
        self._pad = {name: (pad_values or {}).get(name, 0) for name in static_inputs}
        self._buckets = sorted(set(buckets))
        self._warmup_iters = warmup_iters
        self._graphs: dict[int, _Captured] = {}
        self._pool = None

    @property
    def buckets(self) -> list[int]:
        return list(self._buckets)

    @property
    def captured(self) -> bool:
        return len(self._graphs) == len(self._buckets)

    def capture(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool."""
        device = next(iter(self._inputs.values())).device
        self._pool = torch.cuda.graph_pool_handle()
        # A stream of this engine's own to capture on: a captured GEMM keeps its capture stream's cuBLAS
        # workspace, which graphs replayed at once on other streams (token2wav's lanes) must not share.
        # Both streams come from torch's pool of 32 a priority, handed out in turn: a stream asked for per
        # bucket would cycle the pool until another graph set's capture stream was this one's.
        capture = torch.cuda.Stream(device=device)
        # Warm-up runs on a side stream compile kernels and settle lazy initialisation, which must not
        # happen inside a capture.
        side = torch.cuda.Stream(device=device)
        for bucket in reversed(self._buckets):
            args = {name: self._bucket_view(name, bucket) for name in self._inputs}
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(self._warmup_iters):
                    self._step(**args)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=capture):
                outputs = self._step(**args)
            self._graphs[bucket] = _Captured(graph, outputs)
        torch.cuda.synchronize(device)

    def replay(self, **inputs: torch.Tensor) -> StepOutput | None:
        """Run the step on ``inputs`` through the smallest fitting graph; the batch is the longest input.

        Returns the outputs' leading ``batch`` rows as views of the graph's static outputs (valid
        until the next replay), or None when the batch exceeds every bucket and the caller should
        run the step eagerly.
        """
        if not self.captured:
            raise RuntimeError("StepGraphs.replay: call capture() first")
        if not inputs or not set(inputs) <= set(self._inputs):
            raise ValueError(f"replay: expected inputs among {sorted(self._inputs)}, got {sorted(inputs)}")
        # The batch is the longest sliced input; a shorter one fills its leading rows (its pad the rest).
        sliced = [t.shape[0] for name, t in inputs.items() if name not in self._whole]
        if not sliced:
            raise ValueError(f"replay: expected at least one input among {sorted(set(self._inputs) - self._whole)}")
        batch = max(sliced)
        bucket = pick_bucket(self._buckets, batch)
        if bucket is None:
            return None
        for name, src in inputs.items():
            self._stage(name, src, bucket)
        captured = self._graphs[bucket]
        captured.graph.replay()
        return _leading_rows(captured.outputs, batch)

    def _bucket_view(self, name: str, bucket: int) -> torch.Tensor:
        buf = self._inputs[name]
        return buf if name in self._whole else buf[:bucket]

    def _stage(self, name: str, src: torch.Tensor, bucket: int) -> None:
        dst = self._bucket_view(name, bucket)
        if src.dim() != dst.dim() or any(s > d for s, d in zip(src.shape, dst.shape)):
            raise ValueError(
                f"replay: input {name!r} of shape {tuple(src.shape)} does not fit its static buffer "
                f"{tuple(self._inputs[name].shape)}"
            )
        if src.shape != dst.shape and self._pad[name] is not None:
            # Padding rows and columns past the live batch must hold harmless values (pad None: the
            # step never reads them).
            dst.fill_(self._pad[name])
        dst[tuple(slice(0, s) for s in src.shape)].copy_(src, non_blocking=True)


def _leading_rows(outputs: StepOutput, batch: int) -> StepOutput:
    if isinstance(outputs, torch.Tensor):
        return outputs[:batch]
    if isinstance(outputs, tuple):
        return tuple(t[:batch] for t in outputs)
    if isinstance(outputs, dict):
        return {k: t[:batch] for k, t in outputs.items()}
    raise TypeError(f"step output: expected a tensor, tuple or dict of tensors, got {type(outputs).__name__}")
