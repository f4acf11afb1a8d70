"""A decode step on its way through the device: its batch, its tokens on the device (which
the step launched behind it reads), and their copy to the host, read when the host needs them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omni_gateway.engine.sampler import SampleResult
from omni_gateway.engine.sequence import ScheduledBatch


@dataclass(slots=True)
class PendingDecode:
    """``tokens`` is int64 ``[len(batch.seqs)]`` on the device, row i for ``batch.seqs[i]``: only the
    runner's next launch may read it (a later one may overwrite it). ``host`` receives it
    asynchronously; ``ready`` marks the copy's end (None when ``host`` is filled already)."""

    batch: ScheduledBatch
    tokens: torch.Tensor
    host: torch.Tensor
    ready: torch.cuda.Event | None

    @classmethod
    def start(cls, batch: ScheduledBatch, tokens: torch.Tensor, host: torch.Tensor | None = None) -> PendingDecode:
        """The step whose device ``tokens`` were just queued: their copy to ``host`` (pinned int64
        ``[len(tokens)]``, a new one when None) is queued behind them. On the CPU ``tokens`` are the host's."""
        if tokens.device.type != "cuda":
            return cls(batch, tokens, tokens, None)
        if host is None:
            host = torch.empty(len(tokens), dtype=torch.int64, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(batch, tokens, host, ready)

    def results(self) -> list[SampleResult]:
        """Wait for the step and return one token per sequence, as the sampler would have."""
        if self.ready is not None:
            self.ready.synchronize()
        return [SampleResult(token, None) for token in self.host.tolist()]
