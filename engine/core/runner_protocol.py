"""What the engine asks of the runner it drives: ``Runner`` starts steps, each a ``Step`` the engine reads later."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.sequence import ScheduledBatch


class Step(Protocol):
    """A step the runner started: its batch, and ``results()``, which waits for its tokens and
    returns one result per sequence (None where it sampled nothing). ``finish()`` queues what a step
    launched ahead held back until the host absorbed the step before it (grammar masks)."""

    batch: ScheduledBatch

    def results(self) -> list[Any]: ...  # SampleResult | None per sequence

    def finish(self) -> None: ...


class Runner(Protocol):
    """What the engine drives (``ModelRunner``): ``execute(batch)`` starts a step; with ``after``,
    a step whose tokens the host has not read, every sequence decodes the position after its last
    known token, with the token ``after`` samples for it (see ``engine.core.pipelining``)."""

    num_kv_blocks: int
    device: Any  # a torch.device: pipelined decode defaults on where launches are asynchronous (CUDA)

    def execute(self, batch: ScheduledBatch, after: Any = None) -> Step: ...

    def release(self, seq_ids: list[int]) -> None: ...


RunnerFactory = Callable[[EngineConfig, Any], Runner]
