"""A server-VAD turn answered ahead of its end: the turn's transcript computed from the start of a
pause, and the reply prepared from that transcript while the pause lasts.

One turn at a time, known by the item id it will take; that id is also its transcription task's, so
a commit that adopts the speculation simply lets that task run on. Pure state: each method returns
the commands the connection must carry out, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from omni_gateway.gateway.realtime.commands import CancelTask, Generate, Output, StartTask, Transcribe
from omni_gateway.gateway.realtime.items import Item
from omni_gateway.omni.protocol import OmniRequest, OutputChunk, Transcription


@dataclass(slots=True)
class PreparedTurnReply:
    """A reply started from a speculative transcript: the turn as it was heard, the request sent, and
    what the backend produced before a response took it over."""

    response_id: str
    item: Item
    request: OmniRequest
    held: list[OutputChunk] = field(default_factory=list)
    ended: bool = False
    error: str | None = None  # why its stream broke, when it did


@dataclass(slots=True)
class _Pause:
    at: int  # the pause's offset in the input audio
    job: Transcribe
    heard: Transcription | None = None  # the transcript, once known
    failed: bool = False

    @property
    def running(self) -> bool:
        return self.heard is None and not self.failed


class TurnSpeculation:
    def __init__(self) -> None:
        self._pause: _Pause | None = None  # the turn's transcript being computed while the detector waits
        self._adopted: dict[str, Transcribe] = {}  # committed turns whose transcript their speculation computes
        self._prepared: PreparedTurnReply | None = None  # the reply to the speculated turn, being generated

    def begin(self, pause_at: int, job: Transcribe) -> list[Output]:
        """A pause began at ``pause_at``: transcribe the turn so far (replacing any earlier speculation)."""
        out = self.drop()
        self._pause = _Pause(pause_at, job)
        return [*out, StartTask(job.item_id, job)]

    def drop(self) -> list[Output]:
        """Discard the speculative transcription and the reply prepared from it."""
        out: list[Output] = []
        if self._pause is not None and self._pause.running:
            out.append(CancelTask(self._pause.job.item_id))
        out += self._drop_prepared()
        self._pause = None
        return out

    def _drop_prepared(self) -> list[Output]:
        prepared, self._prepared = self._prepared, None
        return [CancelTask(prepared.response_id)] if prepared is not None and not prepared.ended else []

    def commit(self, job: Transcribe, pause_at: int | None) -> tuple[list[Output], Transcription | None]:
        """How to transcribe a committed turn, and its transcript when that is already known. The
        speculation is adopted when it heard this very audio up to the pause that ended the turn (its
        prepared reply stays); else it is dropped and ``job`` runs."""
        pause, self._pause = self._pause, None
        if (
            pause is not None
            and pause_at is not None
            and pause.at == pause_at
            and replace(pause.job, pcm16=job.pcm16) == job
        ):
            if pause.heard is not None:
                return [], pause.heard
            if pause.running:
                self._adopted[job.item_id] = job
                return [], None
            return [StartTask(job.item_id, job)], None  # it failed: the committed audio is transcribed afresh
        out: list[Output] = [CancelTask(pause.job.item_id)] if pause is not None and pause.running else []
        return [*out, *self._drop_prepared(), StartTask(job.item_id, job)], None

    def hold(self, task_id: str, result: Transcription) -> Transcribe | None:
        """The pause's job when ``result`` is the transcript of the pause under way (held for its commit);
        None when it is a committed turn's, to be reported."""
        self._adopted.pop(task_id, None)
        pause = self._pause
        if pause is None or not pause.running or pause.job.item_id != task_id:
            return None
        pause.heard = result
        return pause.job

    def failed(self, task_id: str) -> list[Output] | None:
        """What a failed transcription leads to when it was a speculation's (the pause's: nothing yet; an
        adopted turn's: transcribing the committed audio); None when it was a committed turn's own."""
        adopted = self._adopted.pop(task_id, None)
        if adopted is not None:
            return [StartTask(adopted.item_id, adopted)]
        if self._pause is not None and self._pause.running and self._pause.job.item_id == task_id:
            self._pause.failed = True
            return []
        return None

    def prepare(self, heard: Item, work: Generate) -> list[Output]:
        """Start the reply the turn ``heard`` would get once it ends."""
        out = self._drop_prepared()
        self._prepared = PreparedTurnReply(work.request.request_id, heard, work.request)
        return [*out, StartTask(work.request.request_id, work)]

    def prepared(self, response_id: str) -> PreparedTurnReply | None:
        """The prepared reply generated under ``response_id``, while no response has taken it."""
        return self._prepared if self._prepared is not None and self._prepared.response_id == response_id else None

    def take(
        self, rebuild: Callable[[PreparedTurnReply], OmniRequest]
    ) -> tuple[PreparedTurnReply | None, list[Output]]:
        """The prepared reply for a response being created, when ``rebuild`` (the response's request with
        the turn read as the speculation heard it) equals the request it was started with; else it is
        discarded. Nothing is taken while a pause is still under way: that response is not the turn's."""
        if self._prepared is None or self._pause is not None:
            return None, []
        if rebuild(self._prepared) == self._prepared.request:
            prepared, self._prepared = self._prepared, None
            return prepared, []
        return None, self._drop_prepared()
