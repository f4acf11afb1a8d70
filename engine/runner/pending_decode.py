"""A step on its way through the device: its batch, its sampled tokens on the device (which a step
launched behind it reads), and their copy to the host, read when the host needs them. A step whose
results the runner had to read already (logprobs) is simply resolved. A step launched ahead with
grammar-constrained rows holds its sampling back until ``finish()``: its masks follow the tokens of
the step before it, which the host must absorb first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.runner.sampler import SampleResult
from omni_gateway.kernels.host_copies import to_device


@dataclass(slots=True)
class PendingDecode:
    """``rows`` are the indices into ``batch.seqs`` of the sequences that sample in this step, in
    order; ``tokens`` is int64 ``[len(rows)]`` on the device (None once resolved): only the runner's
    next step may read it (a later one may overwrite it). ``host`` receives it asynchronously;
    ``ready`` marks the copy's end (None when ``host`` is filled already). ``sample``, while set,
    is the step's sampling, not queued yet (see ``deferred``). ``staging``, the decode graphs' pinned
    buffers the step used (``graphed_decode.Staging``), receives ``ready`` as the end of their use."""

    batch: ScheduledBatch
    rows: list[int]
    tokens: torch.Tensor | None
    host: torch.Tensor | None
    ready: torch.cuda.Event | None
    resolved: list[SampleResult | None] | None = None
    sample: Callable[[], torch.Tensor] | None = None
    staging: Any = None

    @classmethod
    def start(cls, batch: ScheduledBatch, rows: list[int], tokens: torch.Tensor, staging: Any = None) -> PendingDecode:
        """The step whose device ``tokens`` (one per entry of ``rows``) were just queued: their copy to
        the host (into ``staging.tokens`` where given) is queued behind them. On the CPU ``tokens`` are
        the host's."""
        pending = cls(batch, rows, None, None, None, staging=staging)
        pending._queue_copy(tokens)
        return pending

    @classmethod
    def deferred(
        cls, batch: ScheduledBatch, rows: list[int], sample: Callable[[], torch.Tensor], staging: Any = None
    ) -> PendingDecode:
        """A step whose forward is queued but whose ``sample()`` (the device tokens of ``rows``) waits
        for ``finish()``: a step launched ahead whose grammar masks need the matchers advanced by the
        tokens of the step in flight. The device runs the forward while the host absorbs that step."""
        return cls(batch, rows, None, None, None, sample=sample, staging=staging)

    def finish(self) -> None:
        """Queue the sampling a deferred step held back (nothing for any other step)."""
        if self.sample is not None:
            sample, self.sample = self.sample, None
            self._queue_copy(sample())

    def _queue_copy(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens
        if tokens.device.type != "cuda":
            self.host = tokens
            return
        self.host = (
            torch.empty(len(tokens), dtype=torch.int64, pin_memory=True)
            if self.staging is None
            else self.staging.tokens[: len(tokens)]
        )
        self.host.copy_(tokens, non_blocking=True)
        self.ready = torch.cuda.Event()
        self.ready.record()
        if self.staging is not None:
            self.staging.copied = self.ready

    @classmethod
    def resolved_with(cls, batch: ScheduledBatch, results: list[SampleResult | None]) -> PendingDecode:
        """A step whose results the host has read already: one per sequence, None where none sampled."""
        return cls(batch, [i for i, r in enumerate(results) if r is not None], None, None, None, results)

    def results(self) -> list[SampleResult | None]:
        """Wait for the step and return one result per sequence of the batch (None where it sampled nothing)."""
        if self.resolved is None:
            self.finish()
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
        self.finish()
        if self.tokens is None:
            raise ValueError("a resolved step's tokens are on the host; only a step in flight feeds the next")
        index = {self.batch.seqs[row].seq_id: i for i, row in enumerate(self.rows)}
        picks = [index[seq.seq_id] for seq in seqs]
        if picks == list(range(len(picks))):
            return self.tokens[: len(picks)]
        return self.tokens[to_device(picks, torch.int64, self.tokens.device)]
