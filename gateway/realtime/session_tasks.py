"""A ``RealtimeSession``'s inputs from its I/O side other than client events: what comes back from its
tasks (transcripts: a committed turn's, the partial ones of a turn being spoken, or the speculative one of
a pause, which prepares the turn's reply; the deadline of a response waiting for them; the cut of a fitted
prompt; the backend's chunks) and the connection's conditions (expiry, a stopped backend, a client that
stopped reading). A response's generation is started here, once its inputs are in."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_gateway.gateway.errors import client_safe
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL,
    CancelTask,
    Close,
    Generate,
    Output,
    SessionLimits,
    StartTask,
    Transcribe,
    new_id,
)
from omni_gateway.gateway.realtime.context import build_request, has_images, recent_frames_only
from omni_gateway.gateway.realtime.image_output import parse_image_options
from omni_gateway.gateway.realtime.items import Content, Item, ItemStore
from omni_gateway.gateway.realtime.partial_transcript import PARTIAL_SUFFIX, PartialTranscripts
from omni_gateway.gateway.realtime.response import Event, ResponseRun
from omni_gateway.gateway.realtime.settings import Dialect, SessionSettings, apply_response_overrides
from omni_gateway.gateway.realtime.speculation import PreparedTurnReply, TurnSpeculation
from omni_gateway.gateway.realtime.truncation import PromptWindow, parse_truncation
from omni_gateway.omni.protocol import (
    AudioChunk,
    Capabilities,
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
    Transcription,
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


class TaskOutcomes:
    """Part of ``RealtimeSession``, which holds the state named below."""

    items: ItemStore
    limits: SessionLimits
    settings: SessionSettings
    dialect: Dialect
    capabilities: Capabilities
    _out: list[Output]
    _responses: dict[str, ResponseRun]
    _pending_asr: set[str]
    _waiting: dict[str, Waiting]
    _speculation: TurnSpeculation
    _partials: PartialTranscripts
    _window: PromptWindow
    _audio_emitted: bool
    _client_stalled: bool

    if TYPE_CHECKING:

        @property
        def _transcribing(self) -> bool: ...

        def _emit(self, event: Event) -> None: ...
        def _flush(self) -> list[Output]: ...
        def _answers_turns(self) -> bool: ...
        def _drop_speculation(self) -> None: ...
        def _fail(self, response_id: str, code: str, message: str, error_type: str) -> None: ...
        def _finish(
            self, response_id: str, status: str, *, reason: str | None = None, error: dict[str, Any] | None = None
        ) -> None: ...

    # ---- the connection's conditions ------------------------------------------------------------------
    def on_expired(self) -> list[Output]:
        """The session reached its maximum duration: say so, then close (1001)."""
        message = f"Your session hit the maximum duration of {self.limits.session_seconds // 60} minutes."
        self._emit(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": "session_expired",
                    "message": message,
                    "param": None,
                    "event_id": None,
                },
            }
        )
        self._out.append(Close(CLOSE_GOING_AWAY, message))
        return self._flush()

    def on_backend_stopped(self) -> list[Output]:
        """The model backend stopped: nothing can be answered any more, so say so and close (1011)."""
        self._emit(
            {
                "type": "error",
                "error": {
                    "type": "server_error",
                    "code": "server_unavailable",
                    "param": None,
                    "event_id": None,
                    "message": "The model backend stopped; this session cannot continue.",
                },
            }
        )
        self._out.append(Close(CLOSE_INTERNAL, "model backend stopped"))
        return self._flush()

    def on_client_stalled(self) -> list[Output]:
        """The client stopped reading its events: stop generating for it until it reads again. Its
        responses fail (the client sees why if it does) and any speculative reply is dropped."""
        self._client_stalled = True
        for response_id in list(self._responses):
            self._finish(response_id, "failed", error=CLIENT_NOT_READING)
            self._out.append(CancelTask(response_id))
        self._drop_speculation()
        return self._flush()

    def on_client_reading(self) -> list[Output]:
        """The client caught up with its events: responses generate again."""
        self._client_stalled = False
        return self._flush()

    # ---- transcripts -----------------------------------------------------------------------------------
    def on_transcription(self, item_id: str, result: Transcription) -> list[Output]:
        """The transcription task ``item_id`` finished: a committed turn's transcript, or the speculative
        one of the pause under way, from which the turn's reply is prepared."""
        job = self._speculation.hold(item_id, result)
        if job is None:
            self._apply_transcript(item_id, result)
        elif result.text.strip() and self._answers_turns() and not self._client_stalled:
            self._prepare_reply(job, result)
        return self._flush()

    def on_partial_transcription(self, task_id: str, result: Transcription | None) -> list[Output]:
        """A partial transcription of the turn being spoken finished (None: it did not run, or failed)."""
        item_id = task_id.removesuffix(PARTIAL_SUFFIX)
        if result is None:
            self._partials.skipped(item_id)
        else:
            self._send_delta(item_id, self._partials.result(item_id, result.text))
        return self._flush()

    def _send_delta(self, item_id: str, delta: str) -> None:
        if delta and self._transcribing:
            self._emit(
                {
                    "type": "conversation.item.input_audio_transcription.delta",
                    "item_id": item_id,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": None,
                }
            )

    def _apply_transcript(self, item_id: str, result: Transcription) -> None:
        item = self.items.get(item_id)
        if item is not None and item.content and item.content[0].type == "input_audio":
            item.content[0].transcript = result.text
        self._send_delta(item_id, self._partials.final(item_id, result.text))
        if self._transcribing:
            seconds = result.duration_s or (audio_fmt.duration_ms(item.content[0].audio or b"") / 1000 if item else 0.0)
            self._emit(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": item_id,
                    "content_index": 0,
                    "transcript": result.text,
                    "logprobs": None,
                    "usage": {"type": "duration", "seconds": round(seconds, 3)},
                }
            )
        self._transcript_in(item_id)

    def _prepare_reply(self, job: Transcribe, result: Transcription) -> None:
        """Start the reply the paused turn gets if it ends now, from the conversation as it would then be."""
        heard = Item(
            job.item_id,
            "message",
            role="user",
            content=[Content("input_audio", audio=job.pcm16, transcript=result.text)],
        )
        settings = apply_response_overrides(self.settings, {}, self.dialect)
        context = [*self.items, heard]
        if "image" not in self.capabilities.input_modalities and has_images(
            recent_frames_only(context, self.limits.max_image_frames)
        ):
            return  # the response will fail; nothing to prepare
        request = build_request(
            new_id("resp"),
            settings,
            context,
            max_image_frames=self.limits.max_image_frames,
            image=parse_image_options(None),
        )
        self._out += self._speculation.prepare(heard, self._generate(request))

    def on_transcription_failed(self, item_id: str, message: str) -> list[Output]:
        retry = self._speculation.failed(item_id)
        if retry is not None:  # a speculation's: the committed audio is transcribed afresh when it counts
            self._out += retry
            return self._flush()
        if self._transcribing:
            self._emit(
                {
                    "type": "conversation.item.input_audio_transcription.failed",
                    "item_id": item_id,
                    "content_index": 0,
                    "error": {
                        "type": "transcription_error",
                        "code": "transcription_failed",
                        "message": message,
                        "param": None,
                    },
                }
            )
        self._transcript_in(item_id)
        return self._flush()

    def _transcript_in(self, item_id: str) -> None:
        """``item_id``'s transcription is over: the responses that waited only for it start generating."""
        self._pending_asr.discard(item_id)
        for response_id, waiting in list(self._waiting.items()):
            waiting.items.discard(item_id)
            if not waiting.items:
                del self._waiting[response_id]
                self._out += [CancelTask(deadline_id(response_id))] if waiting.deadline else []
                self._launch(response_id, waiting.prepared)

    def on_asr_timeout(self, response_id: str) -> list[Output]:
        """A response waited ``asr_timeout_s`` for transcripts: it goes ahead with the audio as it is."""
        waiting = self._waiting.pop(response_id, None)
        if waiting is not None:
            self._launch(response_id, waiting.prepared)
        return self._flush()

    # ---- starting a response's generation ----------------------------------------------------------
    def _launch(self, response_id: str, prepared: PreparedTurnReply | None) -> None:
        """Start generating a response whose inputs are ready, or take over the reply prepared for it."""
        if self._client_stalled:
            self._finish(response_id, "failed", error=CLIENT_NOT_READING)
            self._out += [] if prepared is None else [CancelTask(prepared.response_id)]
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
            self._out.append(StartTask(response_id, self._generate(request)))

    def _generate(self, request: OmniRequest) -> Generate:
        return Generate(request, self._window.plan(parse_truncation(self.settings.truncation)))

    def on_prompt_fitted(self, request_id: str, cut: tuple[Message, ...]) -> list[Output]:
        """The generation ``request_id`` left the oldest messages ``cut`` out of its prompt: later prompts
        start there too, until the conversation outgrows the room again."""
        self._window.cut = cut
        return self._flush()

    def build_request(self, response_id: str) -> OmniRequest | None:
        """The request of a running response, from the conversation as it stands; None once it ended."""
        run = self._responses.get(response_id)
        if run is None:
            return None
        return build_request(
            response_id, run.settings, run.context, max_image_frames=self.limits.max_image_frames, image=run.image
        )

    # ---- backend output ----------------------------------------------------------------------------
    def _held_reply(self, request_id: str) -> PreparedTurnReply | None:
        """The prepared reply generated under ``request_id`` while no running response streams it."""
        waiting = self._waiting.get(request_id)
        return waiting.prepared if waiting is not None else self._speculation.prepared(request_id)

    def on_chunk(self, request_id: str, chunk: OutputChunk) -> list[Output]:
        held = self._held_reply(request_id)
        if held is not None:
            held.held.append(chunk)
        else:
            self._on_chunk(request_id, chunk)
        return self._flush()

    def _on_chunk(self, response_id: str, chunk: OutputChunk) -> None:
        run = self._responses.get(response_id)
        if run is None:
            return  # cancelled: the generation is being torn down
        if isinstance(chunk, TextDelta):
            events = run.on_text(chunk.text) if chunk.index == 0 else []
        elif isinstance(chunk, AudioChunk):
            events = run.on_audio(chunk)
            self._audio_emitted |= run.audio_emitted
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
            )
            events = []
        else:
            events = []
        for ev in events:
            self._emit(ev)

    def _finish_done(self, response_id: str, finish_reason: str) -> None:
        if finish_reason == "length":
            self._finish(response_id, "incomplete", reason="max_output_tokens")
        elif finish_reason == "abort":
            self._finish(response_id, "cancelled", reason="client_cancelled")
        elif finish_reason == "error":
            self._finish(
                response_id,
                "failed",
                error={"type": "server_error", "code": "generation_failed", "message": "The generation failed."},
            )
        else:
            self._finish(response_id, "completed")

    def on_stream_end(self, request_id: str, error: str | None = None) -> list[Output]:
        """The backend stream ended: the response ends as its Done said, or failed when the stream broke."""
        held = self._held_reply(request_id)
        if held is not None:
            held.ended, held.error = True, error
        else:
            self._on_end(request_id, error)
        return self._flush()

    def _on_end(self, response_id: str, error: str | None) -> None:
        run = self._responses.get(response_id)
        if run is None:
            return
        if error is None:
            self._finish_done(response_id, run.finish_reason)
        else:
            self._finish(
                response_id, "failed", error={"type": "server_error", "code": "server_error", "message": error}
            )
