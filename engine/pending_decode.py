"""A decode step on its way through the device: its batch, its tokens on the device (which
the step launched behind it reads), and their copy to the host, read when the host needs them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampler import SampleResult
from engine.sequence import ScheduledBatch


@dataclass(slots=True)
class PendingDecode:
    """``tokens`` is int64 ``[len(batch.seqs)]`` on the device, row i for ``batch.seqs[i]``: only the
    runner's next launch may read it (a later one may overwrite it). ``host`` receives it
    asynchronously; ``ready`` marks the copy's end (None when ``host`` is filled already)."""

    batch: ScheduledBatch
    tokens: torch.Tensor
    host: torch.Tensor
    ready: torch.cuda.Event | None

    def results(self) -> list[SampleResult]:
        """Wait for the step and return one token per sequence, as the sampler would have."""
        if self.ready is not None:
            self.ready.synchronize()
        return [SampleResult(token, None) for token in self.host.tolist()]
