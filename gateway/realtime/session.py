"""The sans-I/O Realtime session: client events in -> server events and commands out.

No sockets, no asyncio, no clock reads beyond the injected ``now``. The connection layer feeds it
client frames, task outcomes (transcripts, backend chunks, deadlines) and its own conditions (expiry,
a stopped backend, a client that stopped reading), sends the ``Send`` events in order and carries out
the commands: start or cancel a task (a turn's transcription, a response's generation, the deadline of
a response waiting for transcripts) and close. A response's generation starts only once the
transcripts of its turns are in (or their deadline passed). A server-VAD turn is transcribed
speculatively from the start of a pause, so that the commit finds its transcript under way; once that
transcript is known, still within the pause, the reply the turn would get is prepared, and the
response created when the turn ends takes it over if its request is exactly the one prepared
(``speculation.TurnSpeculation``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from omni_gateway.gateway.client_text import invalid_text_message, invalid_text_path, shown
from omni_gateway.gateway.errors import SERVER_ERROR
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import (
    AsrDeadline,
    CancelTask,
    Output,
    Send,
    SessionLimits,
    StartTask,
    Transcribe,
    VadFactory,
    new_id,
)
from omni_gateway.gateway.realtime.context import (
    build_request,
    has_images,
    parse_metadata,
    recent_frames_only,
    resolve_input,
)
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_type, invalid_value, missing
from omni_gateway.gateway.realtime.image_output import parse_image_options
from omni_gateway.gateway.realtime.input_audio import (
    InputAudioBuffer,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
)
from omni_gateway.gateway.realtime.items import Content, Item, ItemStore, audio_bytes, decode_base64
from omni_gateway.gateway.realtime.response import Event, ResponseRun
from omni_gateway.gateway.realtime.session_items import ConversationItems
from omni_gateway.gateway.realtime.session_tasks import TaskOutcomes, Waiting, deadline_id
from omni_gateway.gateway.realtime.settings import (
    Dialect,
    SessionSettings,
    TurnDetection,
    apply_response_overrides,
    apply_transcription_update,
    apply_update,
    render_session,
    validate_choice,
)
from omni_gateway.gateway.realtime.speculation import TurnSpeculation
from omni_gateway.gateway.realtime.truncation import PromptWindow
from omni_gateway.omni.protocol import Capabilities, Message, Transcription

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100
_BETA_NAMES = {
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}


class RealtimeSession(ConversationItems, TaskOutcomes):
    def __init__(
        self,
        *,
        dialect: Dialect,
        capabilities: Capabilities,
        vad_factory: VadFactory | None,
        limits: SessionLimits | None = None,
        now: Callable[[], float] = time.time,
        intent: str = "realtime",
        count_tokens: Callable[[tuple[Message, ...]], int] | None = None,
    ) -> None:
        self.dialect = dialect
        self.capabilities = capabilities
        self.limits = limits = limits or SessionLimits()
        self.id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.expires_at = int(now()) + limits.session_seconds
        self._now = now
        # server_vad idle_timeout_ms: when the silence after the last reply's audio ends (None: not armed)
        self.idle_deadline: float | None = None
        # Set when the idle timeout fired; only client audio clears it, so silence answers once, not in a loop.
        self._idle_spent = False
        self._vad_factory = vad_factory
        audio_out = "audio" in capabilities.output_modalities
        self.settings = SessionSettings(
            model=capabilities.model,
            output_modalities=("audio",) if audio_out else ("text",),
            voice=capabilities.voices[0] if capabilities.voices else "alloy",
            turn_detection=TurnDetection() if vad_factory is not None else None,
            kind="transcription" if intent == "transcription" else "realtime",
        )
        self.items = ItemStore()
        self.audio = InputAudioBuffer()
        self._responses: dict[str, ResponseRun] = {}
        self._active: str | None = None  # the response writing to the default conversation
        self._pending_asr: set[str] = set()  # committed turns whose transcript is not in yet
        self._known: list[tuple[str, Transcription]] = []  # adopted transcripts, reported after their commit
        self._waiting: dict[str, Waiting] = {}  # responses whose generation waits for transcripts
        self._window = PromptWindow(count_tokens, capabilities.max_context_tokens)  # where prompts start
        self._pending_turn_id: str | None = None  # announced by speech_started, used by the commit
        self._speculation = TurnSpeculation()
        self._audio_emitted = False
        self._client_stalled = False  # the client stopped reading: nothing is generated for it
        self._out: list[Output] = []
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "session.update": self._session_update,
            "input_audio_buffer.append": self._buffer_append,
            "input_audio_buffer.commit": self._buffer_commit,
            "input_audio_buffer.clear": self._buffer_clear,
            "conversation.item.create": self._item_create,
            "conversation.item.retrieve": self._item_retrieve,
            "conversation.item.truncate": self._item_truncate,
            "conversation.item.delete": self._item_delete,
            "response.create": self._response_create,
            "response.cancel": self._response_cancel,
        }
        if dialect == "beta":
            self._handlers["transcription_session.update"] = self._transcription_session_update
        self._install_vad(self.settings)

    # ---- plumbing ---------------------------------------------------------------------------------
    def _flush(self) -> list[Output]:
        while self._known:
            self._apply_transcript(*self._known.pop(0))
        for response_id, waiting in self._waiting.items():  # still waiting once this input is handled
            if not waiting.deadline:
                waiting.deadline = True
                self._out.append(
                    StartTask(deadline_id(response_id), AsrDeadline(response_id, self.limits.asr_timeout_s))
                )
        out, self._out = self._out, []
        return out

    def _emit(self, event: Event) -> None:
        kind = event["type"]
        if self.dialect == "beta":
            if kind == "conversation.item.done":
                return  # beta announces an item once, with conversation.item.created
            kind = _BETA_NAMES.get(kind, kind)
        self._out.append(Send({"event_id": new_id("event"), **event, "type": kind}))

    def _error(self, err: RealtimeError, client_event_id: str | None) -> None:
        self._emit({"type": "error", "error": err.body(client_event_id)})

    def _new_item_id(self) -> str:
        return new_id("item")

    # ---- entry points -----------------------------------------------------------------------------
    def open(self) -> list[Output]:
        self._emit({"type": "session.created", "session": self._render_session()})
        self._emit(
            {
                "type": "conversation.created",
                "conversation": {"id": self.conversation_id, "object": "realtime.conversation"},
            }
        )
        return self._flush()

    def receive_text(self, text: str) -> list[Output]:
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):
            self._error(RealtimeError("invalid_json", "The message is not valid JSON."), None)
            return self._flush()
        return self.receive(event)

    def receive(self, event: Any) -> list[Output]:
        """One client event; a bad one yields exactly one ``error`` event and changes nothing."""
        if not isinstance(event, dict):
            self._error(RealtimeError("invalid_event", f"Expected a JSON object, got {type(event).__name__}."), None)
            return self._flush()
        bad = invalid_text_path(event)
        event_id = event.get("event_id") if isinstance(event.get("event_id"), str) and bad != "event_id" else None
        if bad is not None:
            self._error(RealtimeError("invalid_value", invalid_text_message(bad), bad or None), event_id)
            return self._flush()
        kind = event.get("type")
        if not isinstance(kind, str):
            self._error(RealtimeError("invalid_event", "The 'type' field is missing.", "type"), event_id)
            return self._flush()
        handler = self._handlers.get(kind)
        if handler is None:
            self._error(
                RealtimeError(
                    "invalid_event",
                    f"Invalid value: {shown(kind)}. Supported values are: "
                    + ", ".join(f"'{k}'" for k in self._handlers)
                    + ".",
                    "type",
                ),
                event_id,
            )
            return self._flush()
        mark = len(self._out)
        try:
            handler(event)
        except RealtimeError as err:
            del self._out[mark:]
            self._error(err, event_id)
        except Exception:
            log.exception("realtime session failed on a client event %r", kind[:64])
            del self._out[mark:]
            self._emit(
                {
                    "type": "error",
                    "error": {
                        "type": "server_error",
                        "code": "server_error",
                        "param": None,
                        "event_id": None,
                        "message": SERVER_ERROR,
                    },
                }
            )
        return self._flush()

    # ---- session --------------------------------------------------------------------------------
    def _render_session(self) -> dict[str, Any]:
        return render_session(self.settings, self.dialect, self.id, self.expires_at)

    def _check_output(self, settings: SessionSettings, param: str) -> None:
        if settings.wants_audio and "audio" not in self.capabilities.output_modalities:
            raise invalid_value(param, "['text'] (this server has no speech output)", ["audio"])
        if settings.wants_image and "image" not in self.capabilities.output_modalities:
            raise RealtimeError(
                "unsupported_modality",
                f"Invalid value for '{param}': this server has no image output model, so 'image' is not available.",
                param,
            )

    def _session_update(self, event: dict[str, Any]) -> None:
        if "session" not in event:
            raise missing("session")
        new = apply_update(self.settings, event["session"], self.dialect)
        self._check_output(new, "session.output_modalities" if self.dialect == "ga" else "session.modalities")
        if new.voice != self.settings.voice and self._audio_emitted:
            raise RealtimeError(
                "cannot_update_voice", "Cannot update a session's voice after audio has been output.", "session.voice"
            )
        if new.turn_detection is not None and self._vad_factory is None:
            raise invalid_value(
                "session.turn_detection",
                "null (this server runs without voice activity detection)",
                new.turn_detection.type,
            )
        new = replace(new, model=self.settings.model)  # the served model is fixed for the connection
        if new.turn_detection != self.settings.turn_detection:
            self._install_vad(new)
            self.idle_deadline = None
        self.settings = new
        self._emit({"type": "session.updated", "session": self._render_session()})

    def _transcription_session_update(self, event: dict[str, Any]) -> None:
        if "session" not in event:
            raise missing("session")
        new = apply_transcription_update(self.settings, event["session"])
        if new.turn_detection is not None and self._vad_factory is None:
            raise invalid_value(
                "session.turn_detection",
                "null (this server runs without voice activity detection)",
                new.turn_detection.type,
            )
        if new.turn_detection != self.settings.turn_detection:
            self._install_vad(new)
        self.settings = new
        self._emit({"type": "transcription_session.updated", "session": self._render_session()})

    @property
    def _transcribing(self) -> bool:
        """Whether transcription results are reported to the client."""
        return self.settings.transcription is not None or self.settings.kind == "transcription"

    def _install_vad(self, settings: SessionSettings) -> None:
        turn = settings.turn_detection
        if turn is None or self._vad_factory is None:
            self._drop_speculation()
            self.audio.set_vad(None)
            return
        vad_settings = turn.vad_settings()
        try:
            vad = self._vad_factory(vad_settings)
        except ValueError as exc:  # the detector's own bounds (e.g. a threshold of exactly 0 or 1)
            raise invalid_value(
                "session.turn_detection", "settings the voice activity detector accepts", str(exc)
            ) from None
        self._drop_speculation()  # the new detector starts a new turn
        self.audio.set_vad(vad, vad_settings.prefix_padding_ms)

    # ---- input audio ----------------------------------------------------------------------------
    def _buffer_append(self, event: dict[str, Any]) -> None:
        if "audio" not in event:
            raise missing("audio")
        raw = decode_base64(event["audio"], "audio")
        if len(raw) > self.limits.max_append_bytes:
            raise invalid_value(
                "audio", f"at most {self.limits.max_append_bytes} bytes of audio per event", f"{len(raw)} bytes"
            )
        try:
            pcm = audio_fmt.decode(raw, self.settings.input_format)
        except audio_fmt.AudioFormatError as exc:
            raise invalid_value("audio", "audio in the session's input_audio_format", str(exc)) from None
        if self.audio.size + len(pcm) > self.limits.max_buffer_bytes:
            raise RealtimeError(
                "input_audio_buffer_full",
                f"The input audio buffer would exceed {self.limits.max_buffer_bytes} bytes; commit or clear it first.",
                "audio",
            )
        self._idle_spent &= not pcm  # audio the client sent re-arms the idle timeout
        for signal in self.audio.append(pcm):
            if isinstance(signal, SpeechStarted):
                self._speech_started(signal)
            elif isinstance(signal, SpeechPaused):
                self._speech_paused(signal)
            elif isinstance(signal, SpeechResumed):
                self._drop_speculation()
            else:
                self._speech_stopped(signal)

    def _speech_paused(self, signal: SpeechPaused) -> None:
        """Start the turn's transcription now: if the pause becomes the stop, the commit reuses it."""
        self._drop_speculation()
        if self._pending_turn_id is None or audio_fmt.duration_ms(signal.pcm16) < MIN_COMMIT_MS:
            return
        self._out += self._speculation.begin(signal.pause_at, self._transcribe_job(self._pending_turn_id, signal.pcm16))

    def _drop_speculation(self) -> None:
        self._out += self._speculation.drop()

    def _speech_started(self, signal: SpeechStarted) -> None:
        self._drop_speculation()
        self._pending_turn_id = self._new_item_id()
        self.idle_deadline = None
        self._emit(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": signal.audio_start_ms,
                "item_id": self._pending_turn_id,
            }
        )
        turn = self.settings.turn_detection
        if turn is not None and turn.interrupt_response and self._active is not None:
            self._cancel(self._active, "turn_detected")

    def _speech_stopped(self, signal: SpeechStopped) -> None:
        item_id = self._pending_turn_id or self._new_item_id()
        self._pending_turn_id = None
        self._emit(
            {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": signal.audio_end_ms, "item_id": item_id}
        )
        if audio_fmt.duration_ms(signal.pcm16) < MIN_COMMIT_MS:
            self._drop_speculation()
            return  # a click, not a turn
        self._commit(signal.pcm16, item_id, pause_at=signal.pause_at)
        if self._answers_turns():
            self._start_response({})
        self._drop_speculation()  # a reply prepared for this turn and not taken up by a response

    def _answers_turns(self) -> bool:
        """Whether a turn that server VAD ends gets a response of its own right away."""
        turn = self.settings.turn_detection
        return turn is not None and turn.create_response and self._active is None and self.settings.kind == "realtime"

    def _buffer_commit(self, event: dict[str, Any]) -> None:
        ms = audio_fmt.duration_ms(self.audio.size)
        if ms < MIN_COMMIT_MS:
            raise RealtimeError(
                "input_audio_buffer_commit_empty",
                "Error committing input audio buffer: buffer too "
                f"small. Expected at least {MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{ms:.2f}ms of audio.",
            )
        self._commit(self.audio.take_all(), self._pending_turn_id or self._new_item_id())
        self._pending_turn_id = None

    def _commit(self, pcm: bytes, item_id: str, pause_at: int | None = None) -> None:
        """Commit ``pcm`` as a user turn; ``pause_at`` says the speech in it ended at that pause."""
        item = Item(item_id, "message", role="user", content=[Content("input_audio", audio=pcm)])
        previous = self._insert(item, None)
        self._emit({"type": "input_audio_buffer.committed", "item_id": item.id, "previous_item_id": previous})
        self._announce(item, previous)
        self._pending_asr.add(item.id)
        self._enforce_audio_budget()
        out, known = self._speculation.commit(self._transcribe_job(item.id, pcm), pause_at)
        self._out += out
        if known is not None:
            self._known.append((item.id, known))

    def _transcribe_job(self, item_id: str, pcm: bytes) -> Transcribe:
        transcription = self.settings.transcription or {}
        return Transcribe(
            item_id,
            pcm,
            audio_fmt.SAMPLE_RATE,
            language=transcription.get("language"),
            prompt=transcription.get("prompt"),
        )

    def _buffer_clear(self, event: dict[str, Any]) -> None:
        self._drop_speculation()
        self.audio.clear()
        self._pending_turn_id = None
        self._emit({"type": "input_audio_buffer.cleared"})

    # ---- responses ------------------------------------------------------------------------------
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
        self._audio_emitted |= run.audio_emitted
        for ev in run.finish(status, reason=reason, error=error):
            self._emit(ev)
        self._enforce_audio_budget()

    def on_idle(self) -> list[Output]:
        """Called when ``idle_deadline`` may have passed: the user stayed silent, so commit and reply."""
        if self.idle_deadline is None or self._now() < self.idle_deadline:
            return self._flush()
        self.idle_deadline = None
        turn = self.settings.turn_detection
        if (
            turn is None
            or turn.idle_timeout_ms is None
            or self._active is not None
            or self.audio.in_speech
            or self._idle_spent
        ):
            return self._flush()
        self._idle_spent = True
        start_ms = int(self.audio.start / audio_fmt.BYTES_PER_MS)
        end_ms = int(self.audio.end / audio_fmt.BYTES_PER_MS)
        item_id = self._new_item_id()
        self._emit(
            {
                "type": "input_audio_buffer.timeout_triggered",
                "audio_start_ms": start_ms,
                "audio_end_ms": end_ms,
                "item_id": item_id,
            }
        )
        if audio_fmt.duration_ms(self.audio.size) >= MIN_COMMIT_MS:
            self._commit(self.audio.take_all(), item_id)
        self._start_response({})
        return self._flush()

    def _enforce_audio_budget(self) -> None:
        self.items.drop_oldest_media("audio", self.limits.max_conversation_audio_bytes)

    @property
    def running_responses(self) -> tuple[str, ...]:
        return tuple(self._responses)
