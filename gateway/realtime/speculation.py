"""A server-VAD turn answered ahead of its end: the turn's transcript computed from the start of a
pause, and the reply prepared from that transcript while the pause lasts.

One turn at a time, known by the item id it will take. Pure state: each method returns the
commands the connection must carry out, in order.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from omni_gateway.gateway.realtime.commands import AdoptSpeculation, DropSpeculation, Output, Prepare, Speculate, Transcribe
from omni_gateway.gateway.realtime.items import Item
from omni_gateway.omni.protocol import OmniRequest


@dataclass(frozen=True, slots=True)
class PreparedTurnReply:
    """A reply started from a speculative transcript: the turn as it was heard, and the request sent."""

    response_id: str
    item: Item
    request: OmniRequest


class TurnSpeculation:
    def __init__(self) -> None:
        # (pause offset, job): the turn's transcript being computed while the detector waits out a pause
        self._pause: tuple[int, Transcribe] | None = None
        self._prepared: PreparedTurnReply | None = None  # the reply to the speculated turn, being generated

    def begin(self, pause_at: int, job: Transcribe) -> list[Output]:
        """A pause began at ``pause_at``: transcribe the turn so far (replacing any earlier speculation)."""
        out = self.drop()
        self._pause = (pause_at, job)
        return [*out, Speculate(job)]

    def drop(self) -> list[Output]:
        """Discard the speculative transcription and the reply prepared from it (one turn: one item id)."""
        item_id = self._pause[1].item_id if self._pause is not None else \
            self._prepared.item.id if self._prepared is not None else None
        self._pause = self._prepared = None
        return [] if item_id is None else [DropSpeculation(item_id)]

    def commit(self, job: Transcribe, pause_at: int | None) -> list[Output]:
        """How to transcribe a committed turn: adopt the speculation when it heard this very audio up to
        the pause that ended the turn (its prepared reply stays); else drop it and run ``job``."""
        pause, self._pause = self._pause, None
        if pause is not None and pause_at is not None and pause[0] == pause_at \
                and replace(pause[1], pcm16=job.pcm16) == job:
            return [AdoptSpeculation(job)]
        self._prepared = None  # it answered the speculation's words, which this turn does not adopt
        return [*([] if pause is None else [DropSpeculation(pause[1].item_id)]), job]

    def is_current(self, job: Transcribe) -> bool:
        """Whether ``job`` is the speculation of the pause still under way."""
        return self._pause is not None and self._pause[1] == job

    def prepare(self, response_id: str, heard: Item, request: OmniRequest) -> list[Output]:
        """Start the reply the turn ``heard`` would get once it ends."""
        self._prepared = PreparedTurnReply(response_id, heard, request)
        return [Prepare(heard.id, request)]

    def take(self, rebuild: Callable[[PreparedTurnReply], OmniRequest]
             ) -> tuple[PreparedTurnReply | None, list[Output]]:
        """The prepared reply for a response being created, when ``rebuild`` (the response's request with
        the turn read as the speculation heard it) equals the request it was started with; else it is
        discarded. Nothing is taken while a pause is still under way: that response is not the turn's."""
        if self._prepared is None or self._pause is not None:
            return None, []
        prepared, self._prepared = self._prepared, None
        if rebuild(prepared) == prepared.request:
            return prepared, []
        return None, [DropSpeculation(prepared.item.id)]
