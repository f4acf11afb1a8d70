"""The responses of a ``RealtimeSession``: ``response.create`` (validated, refused or started: at once, or once
the transcripts of its turns are in, taking over a reply prepared for its turn) and ``response.cancel``, and how
every response finishes (cancelled, failed, done), which also arms the idle timeout."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import CancelTask, Output, SessionLimits, new_id
from omni_gateway.gateway.realtime.context import (
    build_request,
    has_images,
    parse_metadata,
    recent_frames_only,
    resolve_input,
)
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_type, invalid_value
from omni_gateway.gateway.realtime.image_output import parse_image_options
from omni_gateway.gateway.realtime.input_audio import InputAudioBuffer
from omni_gateway.gateway.realtime.items import ItemStore, audio_bytes
from omni_gateway.gateway.realtime.response import Event, ResponseRun
from omni_gateway.gateway.realtime.session_tasks import Waiting, deadline_id
from omni_gateway.gateway.realtime.settings import Dialect, SessionSettings, apply_response_overrides, validate_choice
from omni_gateway.gateway.realtime.speculation import PreparedTurnReply, TurnSpeculation
from omni_gateway.omni.protocol import Capabilities


class ResponseLifecycle:
    """Part of ``RealtimeSession``, which holds the state named below."""

    settings: SessionSettings
    dialect: Dialect
    capabilities: Capabilities
    limits: SessionLimits
    items: ItemStore
    conversation_id: str
    idle_deadline: float | None
    _now: Callable[[], float]
    _idle_spent: bool
    _idle_from: int
    audio: InputAudioBuffer
    _audio_emitted: bool
    _active: str | None
    _responses: dict[str, ResponseRun]
    _pending_asr: set[str]
    _waiting: dict[str, Waiting]
    _speculation: TurnSpeculation
    _out: list[Output]

    if TYPE_CHECKING:

        def _emit(self, event: Event) -> None: ...
        def _new_item_id(self) -> str: ...
        def _check_output(self, settings: SessionSettings, param: str) -> None: ...
        def _launch(self, response_id: str, prepared: PreparedTurnReply | None) -> None: ...
        def _enforce_audio_budget(self) -> None: ...

    def _response_create(self, event: dict[str, Any]) -> None:
        params = event.get("response")
        if params is None:  # absent or null: a response with the session's defaults
            params = {}
        if not isinstance(params, dict):  # [], "", 0 and false are not "no parameters"
            raise invalid_type("response", "an object", params)
        self._start_response(params)

    def _start_response(self, params: dict[str, Any]) -> None:
        if self.settings.kind == "transcription":
            raise invalid_value(
                "session.type", "a 'realtime' session (a transcription session never responds)", "transcription"
            )
        conversation = validate_choice(params.get("conversation", "auto"), ("auto", "none"), "response.conversation")
        if conversation == "auto" and self._active is not None:
            raise RealtimeError(
                "conversation_already_has_active_response",
                "Conversation already has an active "
                f"response in progress: {self._active}. Wait until the response is finished before "
                "creating a new one.",
            )
        settings = apply_response_overrides(self.settings, params, self.dialect)
        self._check_output(settings, "response.output_modalities" if self.dialect == "ga" else "response.modalities")
        metadata = parse_metadata(params.get("metadata"))
        image = parse_image_options(params.get("image"))
        context = resolve_input(
            params.get("input"),
            self.items,
            self._new_item_id,
            self.settings.input_format,
            max_image_bytes=self.limits.max_image_bytes,
        )
        prepared, dropped = self._speculation.take(
            lambda p: build_request(
                p.response_id,
                settings,
                [p.item if it.id == p.item.id else it for it in context],
                max_image_frames=self.limits.max_image_frames,
                image=image,
            )
        )
        self._out += dropped
        run = ResponseRun(
            prepared.response_id if prepared is not None else new_id("resp"),
            settings,
            self.dialect,
            store=self.items if conversation == "auto" else None,
            conversation_id=self.conversation_id if conversation == "auto" else None,
            metadata=metadata,
            context=context,
            new_item_id=self._new_item_id,
            image=image,
        )
        self._responses[run.id] = run
        if conversation == "auto":
            self._active = run.id
            self.idle_deadline = None
        for ev in run.created():
            self._emit(ev)
        refusal = None
        if "image" not in self.capabilities.input_modalities and has_images(
            recent_frames_only(context, self.limits.max_image_frames)
        ):
            refusal = (
                "unsupported_modality",
                f"The conversation holds images, but the served model {self.capabilities.model!r} has no image input.",
            )
        elif len(self._responses) > self.limits.max_responses:
            refusal = (
                "rate_limit_exceeded",
                f"This session already runs {self.limits.max_responses} responses; wait for one to finish.",
            )
        if refusal is not None:
            self._out += [] if prepared is None else [CancelTask(prepared.response_id)]
            self._fail(run.id, *refusal, "invalid_request_error")
            return
        wait = {it.id for it in context if it.id in self._pending_asr}
        if wait:
            self._waiting[run.id] = Waiting(wait, prepared)
        else:
            self._launch(run.id, prepared)

    def _response_cancel(self, event: dict[str, Any]) -> None:
        response_id = event.get("response_id")
        if response_id is not None and not isinstance(response_id, str):
            raise invalid_type("response_id", "a string", response_id)
        target = response_id if response_id is not None else self._active
        if target is None or target not in self._responses:
            raise RealtimeError("response_cancel_not_active", "Cancellation failed: no active response found.")
        self._cancel(target, "client_cancelled")

    def _cancel(self, response_id: str, reason: str) -> None:
        self._finish(response_id, "cancelled", reason=reason)
        self._out.append(CancelTask(response_id))

    def _fail(self, response_id: str, code: str, message: str, error_type: str) -> None:
        """Fail a response and say why in an ``error`` event too, for clients that only watch those."""
        error = {"type": error_type, "code": code, "message": message}
        self._emit({"type": "error", "error": {**error, "param": None, "event_id": None}})
        self._finish(response_id, "failed", error=error)

    def _finish(
        self, response_id: str, status: str, *, reason: str | None = None, error: dict[str, Any] | None = None
    ) -> None:
        run = self._responses.pop(response_id, None)
        if run is None:
            return
        waiting = self._waiting.pop(response_id, None)
        if waiting is not None and waiting.deadline:
            self._out.append(CancelTask(deadline_id(response_id)))
        if self._active == response_id:
            self._active = None
            turn = self.settings.turn_detection
            if turn is not None and turn.idle_timeout_ms is not None and not self._idle_spent:
                # the reply plays in real time on the client; the idle wait starts when it has played out
                played_ms = sum(
                    audio_fmt.duration_ms(audio_bytes(c))
                    for it in run.output
                    for c in it.content
                    if c.type == "output_audio"
                )
                self.idle_deadline = self._now() + (played_ms + turn.idle_timeout_ms) / 1000
                self._idle_from = self.audio.end + round(played_ms) * audio_fmt.BYTES_PER_MS
        self._audio_emitted |= run.audio_emitted
        for ev in run.finish(status, reason=reason, error=error):
            self._emit(ev)
        self._enforce_audio_budget()

    @property
    def running_responses(self) -> tuple[str, ...]:
        return tuple(self._responses)
