"""The responses of a ``RealtimeSession`` from creation to their end: ``response.create`` (refused, or started at
once or once its turns' transcripts are in, taking over a reply prepared for its turn), ``response.cancel``, the
generation (request, prompt window, the backend's chunks, the stream's end) and how each response finishes
(cancelled, failed, done), which arms the idle timeout. Uses the core only."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni_gateway.gateway.errors import client_safe
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import AsrDeadline, CancelTask, Generate, StartTask, new_id
from omni_gateway.gateway.realtime.context import (
    build_request,
    has_images,
    parse_metadata,
    recent_frames_only,
    resolve_input,
)
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_type, invalid_value
from omni_gateway.gateway.realtime.image_output import parse_image_options
from omni_gateway.gateway.realtime.items import Item, audio_bytes
from omni_gateway.gateway.realtime.response import Event, ResponseRun
from omni_gateway.gateway.realtime.session_core import SessionCore
from omni_gateway.gateway.realtime.settings import apply_response_overrides, validate_choice
from omni_gateway.gateway.realtime.speculation import PreparedTurnReply
from omni_gateway.gateway.realtime.truncation import PromptWindow, parse_truncation
from omni_gateway.omni.protocol import (
    AudioChunk,
    Done,
    Error,
    ImageFinal,
    ImagePartial,
    Message,
    OmniRequest,
    OutputChunk,
    TextDelta,
    ToolCallArguments,
    ToolCallDelta,
    Usage,
)

log = logging.getLogger(__name__)

CLIENT_NOT_READING = {
    "type": "invalid_request_error",
    "code": "client_not_reading",
    "message": "The response was stopped because the client was not reading its events.",
}


@dataclass(slots=True)
class Waiting:
    """A response whose generation starts once the transcripts of ``items`` are in."""

    items: set[str]
    prepared: PreparedTurnReply | None  # the reply it takes over then, generated ahead
    deadline: bool = False  # its AsrDeadline task was started


def deadline_id(response_id: str) -> str:
    """The id of the ``AsrDeadline`` task of a response waiting for transcripts."""
    return response_id + ":asr"


class Responses:
    """The session's running responses and the one writing to the default conversation."""

    def __init__(self, core: SessionCore, count_tokens: Callable[[tuple[Message, ...]], int] | None) -> None:
        self._core = core
        self._runs: dict[str, ResponseRun] = {}
        self._active: str | None = None  # the response writing to the default conversation
        self._waiting: dict[str, Waiting] = {}  # responses whose generation waits for transcripts
        self._window = PromptWindow(count_tokens, core.capabilities.max_context_tokens)  # where prompts start
        self._client_stalled = False  # the client stopped reading: nothing is generated for it

    @property
    def active(self) -> str | None:
        """The response writing to the default conversation, if one is."""
        return self._active

    @property
    def running(self) -> tuple[str, ...]:
        return tuple(self._runs)

    @property
    def client_stalled(self) -> bool:
        return self._client_stalled

    def writer_of(self, item: Item) -> str | None:
        """The active response, when it is writing ``item``."""
        if self._active is not None and any(it is item for it in self._runs[self._active].output):
            return self._active
        return None

    # ---- response.create / response.cancel ----------------------------------------------------------
    def response_create(self, event: dict[str, Any]) -> None:
        params = event.get("response")
        if params is None:  # absent or null: a response with the session's defaults
            params = {}
        if not isinstance(params, dict):  # [], "", 0 and false are not "no parameters"
            raise invalid_type("response", "an object", params)
        self.start(params)

    def start(self, params: dict[str, Any], turn: str | None = None) -> None:
        """Create a response with ``params`` (a ``response.create``'s ``response``); ``turn``: the item of the
        detector's turn it answers."""
        core = self._core
        if core.settings.kind == "transcription":
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
        settings = apply_response_overrides(core.settings, params, core.dialect)
        core.check_output(settings, "response.output_modalities" if core.dialect == "ga" else "response.modalities")
        core.check_voice(settings, "response.audio.output.voice" if core.dialect == "ga" else "response.voice")
        metadata = parse_metadata(params.get("metadata"))
        image = parse_image_options(params.get("image"))
        context = resolve_input(
            params.get("input"),
            core.items,
            core.new_item_id,
            core.settings.input_format,
            max_image_bytes=core.limits.max_image_bytes,
        )
        prepared, dropped = core.speculation.take(
            lambda p: build_request(
                p.response_id,
                settings,
                [p.item if it.id == p.item.id else it for it in context],
                max_image_frames=core.limits.max_image_frames,
                image=image,
            )
        )
        core.issue(*dropped)
        run = ResponseRun(
            prepared.response_id if prepared is not None else new_id("resp"),
            settings,
            core.dialect,
            store=core.items if conversation == "auto" else None,
            conversation_id=core.conversation_id if conversation == "auto" else None,
            metadata=metadata,
            context=context,
            new_item_id=core.new_item_id,
            image=image,
        )
        self._runs[run.id] = run
        if turn is not None:
            core.voice.response_created(run.id, turn)
        if conversation == "auto":
            self._active = run.id
            core.idle_deadline = None
        for ev in run.created():
            core.emit(ev)
        refusal = None
        if "image" not in core.capabilities.input_modalities and has_images(
            recent_frames_only(context, core.limits.max_image_frames)
        ):
            refusal = (
                "unsupported_modality",
                f"The conversation holds images, but the served model {core.capabilities.model!r} has no image input.",
            )
        elif len(self._runs) > core.limits.max_responses:
            refusal = (
                "rate_limit_exceeded",
                f"This session already runs {core.limits.max_responses} responses; wait for one to finish.",
            )
        if refusal is not None:
            core.issue(*([] if prepared is None else [CancelTask(prepared.response_id)]))
            self._fail(run.id, *refusal, "invalid_request_error")
            return
        wait = {it.id for it in context if it.id in core.pending_asr}
        if wait:
            self._waiting[run.id] = Waiting(wait, prepared)
        else:
            self._launch(run.id, prepared)

    def response_cancel(self, event: dict[str, Any]) -> None:
        response_id = event.get("response_id")
        if response_id is not None and not isinstance(response_id, str):
            raise invalid_type("response_id", "a string", response_id)
        target = response_id if response_id is not None else self._active
        if target is None or target not in self._runs:
            raise RealtimeError("response_cancel_not_active", "Cancellation failed: no active response found.")
        self.cancel(target, "client_cancelled")

    def cancel(self, response_id: str, reason: str) -> None:
        self._finish(response_id, "cancelled", reason=reason)
        self._core.issue(CancelTask(response_id))

    # ---- waiting for transcripts --------------------------------------------------------------------
    def transcript_in(self, item_id: str) -> None:
        """``item_id``'s transcription is over: the responses that waited only for it start generating."""
        self._core.pending_asr.discard(item_id)
        for response_id, waiting in list(self._waiting.items()):
            waiting.items.discard(item_id)
            if not waiting.items:
                del self._waiting[response_id]
                self._core.issue(*([CancelTask(deadline_id(response_id))] if waiting.deadline else []))
                self._launch(response_id, waiting.prepared)

    def start_deadlines(self) -> None:
        """Responses still waiting once an input is handled wait ``asr_timeout_s`` at most."""
        for response_id, waiting in self._waiting.items():
            if not waiting.deadline:
                waiting.deadline = True
                self._core.issue(
                    StartTask(deadline_id(response_id), AsrDeadline(response_id, self._core.limits.asr_timeout_s))
                )

    def asr_timeout(self, response_id: str) -> None:
        """A response waited ``asr_timeout_s`` for transcripts: it goes ahead with the audio as it is."""
        waiting = self._waiting.pop(response_id, None)
        if waiting is not None:
            self._launch(response_id, waiting.prepared)

    # ---- generation ---------------------------------------------------------------------------------
    def _launch(self, response_id: str, prepared: PreparedTurnReply | None) -> None:
        """Start generating a response whose inputs are ready, or take over the reply prepared for it."""
        if self._client_stalled:
            self._finish(response_id, "failed", error=CLIENT_NOT_READING)
            self._core.issue(*([] if prepared is None else [CancelTask(prepared.response_id)]))
            return
        if prepared is not None:
            for chunk in prepared.held:
                self._on_chunk(response_id, chunk)
            if prepared.ended:
                self._on_end(response_id, prepared.error)
            return
        try:
            request = self.build_request(response_id)
        except Exception:
            log.exception("building the request of %s failed", response_id)
            self._finish(
                response_id,
                "failed",
                error={"type": "server_error", "code": "server_error", "message": "The request could not be built."},
            )
            return
        if request is not None and not request.messages:
            # nothing to answer: no instructions and no item the model can read (a client condition)
            self._fail(
                response_id,
                "empty_conversation",
                "The response has nothing to respond to: the conversation "
                "has no message the model can read and the session has no instructions.",
                "invalid_request_error",
            )
        elif request is not None:
            self._core.issue(StartTask(response_id, self.generate(request)))

    def generate(self, request: OmniRequest) -> Generate:
        """The generation task of ``request``, its prompt starting where the window says."""
        return Generate(request, self._window.plan(parse_truncation(self._core.settings.truncation)))

    def prompt_fitted(self, cut: tuple[Message, ...]) -> None:
        """A generation left the oldest messages ``cut`` out: later prompts start there too."""
        self._window.cut = cut

    def build_request(self, response_id: str) -> OmniRequest | None:
        """The request of a running response, from the conversation as it stands; None once it ended."""
        run = self._runs.get(response_id)
        if run is None:
            return None
        return build_request(
            response_id, run.settings, run.context, max_image_frames=self._core.limits.max_image_frames, image=run.image
        )

    def _held_reply(self, request_id: str) -> PreparedTurnReply | None:
        """The prepared reply generated under ``request_id`` while no running response streams it."""
        waiting = self._waiting.get(request_id)
        return waiting.prepared if waiting is not None else self._core.speculation.prepared(request_id)

    def chunk(self, request_id: str, chunk: OutputChunk) -> None:
        """A chunk of the backend's output for ``request_id``."""
        held = self._held_reply(request_id)
        if held is not None:
            held.held.append(chunk)
        else:
            self._on_chunk(request_id, chunk)

    def _on_chunk(self, response_id: str, chunk: OutputChunk) -> None:
        run = self._runs.get(response_id)
        if run is None:
            return  # cancelled: the generation is being torn down
        if isinstance(chunk, TextDelta):
            events = run.on_text(chunk.text) if chunk.index == 0 else []
        elif isinstance(chunk, AudioChunk):
            events = run.on_audio(chunk)
            self._core.audio_emitted |= run.audio_emitted
            self._heard(response_id, run, events)
        elif isinstance(chunk, ToolCallArguments):
            events = run.on_tool_arguments(chunk) if chunk.index == 0 else []
        elif isinstance(chunk, ToolCallDelta):
            events = run.on_tool_call(chunk) if chunk.index == 0 else []
        elif isinstance(chunk, ImagePartial):
            events = run.on_image_partial(chunk)
        elif isinstance(chunk, ImageFinal):
            events = run.on_image_final(chunk)
        elif isinstance(chunk, Usage):
            run.usage = chunk
            events = []
        elif isinstance(chunk, Done):
            # Finished at the end of the stream, so a Usage chunk sent after Done still lands in response.done.
            if chunk.index == 0:
                run.finish_reason = chunk.finish_reason
            events = []
        elif isinstance(chunk, Error):
            chunk = client_safe(chunk)
            self._fail(
                response_id,
                chunk.code,
                chunk.message,
                "server_error" if chunk.status >= 500 else "invalid_request_error",
                chunk.param if chunk.status < 500 else None,
            )
            events = []
        else:
            events = []
        for ev in events:
            self._core.emit(ev)

    def _heard(self, response_id: str, run: ResponseRun, events: list[Event]) -> None:
        """Tell the voice observer how much audio ``events`` send the client."""
        for ev in events:
            if ev["type"] == "response.output_audio.delta":
                ms = audio_fmt.wire_duration_ms(ev["delta"].decoded_size(), run.settings.output_format)
                self._core.voice.audio_delta(response_id, ms / 1000, self._core.now())

    def stream_end(self, request_id: str, error: str | None) -> None:
        """The backend stream ended: the response ends as its Done said, or failed when the stream broke."""
        held = self._held_reply(request_id)
        if held is not None:
            held.ended, held.error = True, error
        else:
            self._on_end(request_id, error)

    def _on_end(self, response_id: str, error: str | None) -> None:
        run = self._runs.get(response_id)
        if run is None:
            return
        if error is not None:
            self._finish(
                response_id, "failed", error={"type": "server_error", "code": "server_error", "message": error}
            )
        elif run.finish_reason == "length":
            self._finish(response_id, "incomplete", reason="max_output_tokens")
        elif run.finish_reason == "abort":
            self._finish(response_id, "cancelled", reason="client_cancelled")
        elif run.finish_reason == "error":
            self._finish(
                response_id,
                "failed",
                error={"type": "server_error", "code": "generation_failed", "message": "The generation failed."},
            )
        else:
            self._finish(response_id, "completed")

    # ---- a client that stopped reading --------------------------------------------------------------
    def client_stopped_reading(self) -> None:
        """Nothing is generated for the client until it reads again: its responses fail (it sees why if it does)."""
        self._client_stalled = True
        for response_id in list(self._runs):
            self._core.voice.response_done(response_id, heard=False)  # its pace was the client's, not the server's
            self._finish(response_id, "failed", error=CLIENT_NOT_READING)
            self._core.issue(CancelTask(response_id))

    def client_reading(self) -> None:
        self._client_stalled = False

    # ---- how a response finishes --------------------------------------------------------------------
    def _fail(self, response_id: str, code: str, message: str, error_type: str, param: str | None = None) -> None:
        """Fail a response and say why in an ``error`` event too, for clients that only watch those (with the
        field at fault, where the backend named one)."""
        error = {"type": error_type, "code": code, "message": message}
        self._core.emit({"type": "error", "error": {**error, "param": param, "event_id": None}})
        self._finish(response_id, "failed", error=error)

    def _finish(
        self, response_id: str, status: str, *, reason: str | None = None, error: dict[str, Any] | None = None
    ) -> None:
        core = self._core
        run = self._runs.pop(response_id, None)
        if run is None:
            return
        waiting = self._waiting.pop(response_id, None)
        if waiting is not None and waiting.deadline:
            core.issue(CancelTask(deadline_id(response_id)))
        if self._active == response_id:
            self._active = None
            turn = core.settings.turn_detection
            if turn is not None and turn.idle_timeout_ms is not None and not core.idle_spent:
                # the reply plays in real time on the client; the idle wait starts when it has played out
                played_ms = sum(
                    audio_fmt.duration_ms(audio_bytes(c))
                    for it in run.output
                    for c in it.content
                    if c.type == "output_audio"
                )
                core.idle_deadline = core.now() + (played_ms + turn.idle_timeout_ms) / 1000
                core.idle_from = core.audio.end + round(played_ms) * audio_fmt.BYTES_PER_MS
        core.audio_emitted |= run.audio_emitted
        core.voice.response_done(response_id)
        for ev in run.finish(status, reason=reason, error=error):
            core.emit(ev)
        core.enforce_audio_budget()
