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

This module holds the session's state, turns each client event into one handler call (a bad event into one
``error`` and no change) and collects what the handlers emit; the handlers live by job next to it:
``session_config`` (session.update), ``session_audio`` (the input audio buffer, server-VAD turns, the idle
timeout), ``session_items`` (conversation.item.*), ``session_responses`` (response.create/cancel and how a
response finishes) and ``session_tasks`` (task outcomes and the connection's conditions).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from omni_gateway.gateway.client_text import invalid_text_message, invalid_text_path, shown
from omni_gateway.gateway.errors import SERVER_ERROR
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import (
    AsrDeadline,
    Output,
    Send,
    SessionLimits,
    StartTask,
    VadFactory,
    new_id,
)
from omni_gateway.gateway.realtime.errors import RealtimeError
from omni_gateway.gateway.realtime.input_audio import InputAudioBuffer
from omni_gateway.gateway.realtime.items import ItemStore
from omni_gateway.gateway.realtime.partial_transcript import PartialTranscripts
from omni_gateway.gateway.realtime.response import Event, ResponseRun
from omni_gateway.gateway.realtime.session_audio import InputTurns
from omni_gateway.gateway.realtime.session_config import SessionConfiguration
from omni_gateway.gateway.realtime.session_items import ConversationItems
from omni_gateway.gateway.realtime.session_responses import ResponseLifecycle
from omni_gateway.gateway.realtime.session_tasks import TaskOutcomes, Waiting, deadline_id
from omni_gateway.gateway.realtime.settings import Dialect, SessionSettings, TurnDetection
from omni_gateway.gateway.realtime.speculation import TurnSpeculation
from omni_gateway.gateway.realtime.truncation import PromptWindow
from omni_gateway.omni.protocol import Capabilities, Message, Transcription

log = logging.getLogger(__name__)

_BETA_NAMES = {
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}


class RealtimeSession(SessionConfiguration, InputTurns, ConversationItems, ResponseLifecycle, TaskOutcomes):
    """One client's session: its state, plumbing and entry points; the parts it inherits decide the events."""

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
        # where that silence starts in the input stream (the reply's playback end, input arriving in real time)
        self._idle_from = 0
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
        self._partials = PartialTranscripts((limits.partial_transcript_ms or 0) * audio_fmt.BYTES_PER_MS)
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

    def _enforce_audio_budget(self) -> None:
        self.items.drop_oldest_media("audio", self.limits.max_conversation_audio_bytes)
