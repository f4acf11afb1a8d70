"""A step on its way through the device: its batch, its sampled tokens on the device (which a step
launched behind it reads), and their copy to the host, read when the host needs them. A step whose
results the runner had to read already (logprobs) is simply resolved."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omni_gateway.engine.sampler import SampleResult, to_device
from omni_gateway.engine.sequence import ScheduledBatch, Sequence


@dataclass(slots=True)
class PendingDecode:
    """``rows`` are the indices into ``batch.seqs`` of the sequences that sample in this step, in
    order; ``tokens`` is int64 ``[len(rows)]`` on the device (None once resolved): only the runner's
    next step may read it (a later one may overwrite it). ``host`` receives it asynchronously;
    ``ready`` marks the copy's end (None when ``host`` is filled already)."""

    batch: ScheduledBatch
    rows: list[int]
    tokens: torch.Tensor | None
    host: torch.Tensor | None
    ready: torch.cuda.Event | None
    resolved: list[SampleResult | None] | None = None

    @classmethod
    def start(
        cls, batch: ScheduledBatch, rows: list[int], tokens: torch.Tensor, host: torch.Tensor | None = None
    ) -> PendingDecode:
        """The step whose device ``tokens`` (one per entry of ``rows``) were just queued: their copy to
        ``host`` (pinned int64 ``[len(tokens)]``, a new one when None) is queued behind them. On the
        CPU ``tokens`` are the host's."""
        if tokens.device.type != "cuda":
            return cls(batch, rows, tokens, tokens, None)
        if host is None:
            host = torch.empty(len(tokens), dtype=torch.int64, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(batch, rows, tokens, host, ready)

    @classmethod
    def resolved_with(cls, batch: ScheduledBatch, results: list[SampleResult | None]) -> PendingDecode:
        """A step whose results the host has read already: one per sequence, None where none sampled."""
        return cls(batch, [i for i, r in enumerate(results) if r is not None], None, None, None, results)

    def results(self) -> list[SampleResult | None]:
        """Wait for the step and return one result per sequence of the batch (None where it sampled nothing)."""
        if self.resolved is None:
            if self.ready is not None:
                self.ready.synchronize()
            assert self.host is not None
            out: list[SampleResult | None] = [None] * len(self.batch.seqs)
            for row, token in zip(self.rows, self.host.tolist()):
                out[row] = SampleResult(token, None)
            self.resolved = out
        return self.resolved

    def tokens_for(self, seqs: list[Sequence]) -> torch.Tensor:
        """The device tokens this step samples for ``seqs`` (each of which samples in it), in the order
        of ``seqs``: the token ids of a step launched behind this one."""
        if self.tokens is None:
            raise ValueError("a resolved step's tokens are on the host; only a step in flight feeds the next")
        index = {self.batch.seqs[row].seq_id: i for i, row in enumerate(self.rows)}
        picks = [index[seq.seq_id] for seq in seqs]
        if picks == list(range(len(picks))):
            return self.tokens[: len(picks)]
        return self.tokens[to_device(picks, torch.int64, self.tokens.device)]
