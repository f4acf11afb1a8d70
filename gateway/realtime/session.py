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
(``speculation.TurnSpeculation``). A ``voice_timing.VoiceObserver``, when given, is told of the detector's turns
and the audio sent, to time what the user hears.

This module builds the session from its parts, turns each client event into one handler call (a bad event
into one ``error`` and no change) and each task outcome or condition of the connection into one call of the
part it concerns, and hands back what they produced. The parts are objects built in this order; each holds
the ``SessionCore`` and the parts before it, never a part after it nor the session, so calls run one way
(``tests/gateway/test_session_parts.py`` keeps it so):

1. ``session_core``: the state the parts share (settings, conversation, input audio buffer, speculation, idle
   timeout) and the output, in order;
2. ``session_responses``: response.create/cancel, the generation and the backend's output, how a response ends;
3. ``session_items``: conversation.item.*, and adding any item to the conversation;
4. ``session_audio``: input_audio_buffer.*, the voice activity detector and the turns it finds, the idle timeout;
5. ``session_config``: session.update;
6. ``session_tasks``: transcripts and the connection's conditions.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from omni_gateway.gateway.client_text import invalid_text_message, invalid_text_path, shown
from omni_gateway.gateway.errors import SERVER_ERROR
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import Output, SessionLimits, VadFactory
from omni_gateway.gateway.realtime.errors import RealtimeError
from omni_gateway.gateway.realtime.input_audio import InputAudioBuffer
from omni_gateway.gateway.realtime.items import ItemStore
from omni_gateway.gateway.realtime.session_audio import InputTurns
from omni_gateway.gateway.realtime.session_config import SessionConfiguration
from omni_gateway.gateway.realtime.session_core import SessionCore
from omni_gateway.gateway.realtime.session_items import ConversationItems
from omni_gateway.gateway.realtime.session_responses import Responses
from omni_gateway.gateway.realtime.session_tasks import TaskOutcomes
from omni_gateway.gateway.realtime.settings import Dialect, SessionSettings, TurnDetection
from omni_gateway.gateway.realtime.voice_timing import VoiceObserver
from omni_gateway.omni.protocol import Capabilities, Message, OmniRequest, OutputChunk, Transcription

log = logging.getLogger(__name__)


class RealtimeSession:
    """One client's session: its entry points; the parts it is built from decide the events."""

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
        voice: VoiceObserver | None = None,
        model: str | None = None,
        adapters: Callable[[], Collection[str]] = tuple,
    ) -> None:
        """``model``: the served model or a LoRA adapter over it (one of ``adapters()``), checked by the
        caller; None: the served model."""
        limits = limits or SessionLimits()
        audio_out = "audio" in capabilities.output_modalities
        settings = SessionSettings(
            model=model or capabilities.model,
            output_modalities=("audio",) if audio_out else ("text",),
            voice=capabilities.voices[0] if capabilities.voices else "alloy",
            turn_detection=TurnDetection() if vad_factory is not None else None,
            kind="transcription" if intent == "transcription" else "realtime",
        )
        self._core = core = SessionCore(
            dialect=dialect,
            capabilities=capabilities,
            limits=limits,
            settings=settings,
            now=now,
            partial_every_bytes=(limits.partial_transcript_ms or 0) * audio_fmt.BYTES_PER_MS,
            voice=voice,
            adapters=adapters,
        )
        self._responses = Responses(core, count_tokens)
        self._items = ConversationItems(core, self._responses)
        self._turns = InputTurns(core, self._items, self._responses, vad_factory)
        self._config = SessionConfiguration(core, self._turns)
        self._tasks = TaskOutcomes(core, self._responses, self._turns)
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "session.update": self._config.session_update,
            "input_audio_buffer.append": self._turns.buffer_append,
            "input_audio_buffer.commit": self._turns.buffer_commit,
            "input_audio_buffer.clear": self._turns.buffer_clear,
            "conversation.item.create": self._items.item_create,
            "conversation.item.retrieve": self._items.item_retrieve,
            "conversation.item.truncate": self._items.item_truncate,
            "conversation.item.delete": self._items.item_delete,
            "response.create": self._responses.response_create,
            "response.cancel": self._responses.response_cancel,
        }
        if dialect == "beta":
            self._handlers["transcription_session.update"] = self._config.transcription_session_update
        self._turns.install_vad(settings)

    # ---- what the connection and the tests read -----------------------------------------------------
    @property
    def id(self) -> str:
        return self._core.id

    @property
    def dialect(self) -> Dialect:
        return self._core.dialect

    @property
    def capabilities(self) -> Capabilities:
        return self._core.capabilities

    @property
    def limits(self) -> SessionLimits:
        return self._core.limits

    @property
    def conversation_id(self) -> str:
        return self._core.conversation_id

    @property
    def expires_at(self) -> int:
        return self._core.expires_at

    @property
    def settings(self) -> SessionSettings:
        return self._core.settings

    @property
    def items(self) -> ItemStore:
        return self._core.items

    @property
    def audio(self) -> InputAudioBuffer:
        return self._core.audio

    @property
    def idle_deadline(self) -> float | None:
        """When the server_vad idle timeout fires (None: not armed); ``on_idle`` acts once it passed."""
        return self._core.idle_deadline

    @idle_deadline.setter
    def idle_deadline(self, deadline: float | None) -> None:
        self._core.idle_deadline = deadline

    @property
    def running_responses(self) -> tuple[str, ...]:
        return self._responses.running

    def build_request(self, response_id: str) -> OmniRequest | None:
        """The request of a running response, from the conversation as it stands; None once it ended."""
        return self._responses.build_request(response_id)

    # ---- plumbing ---------------------------------------------------------------------------------
    def _flush(self) -> list[Output]:
        while known := self._turns.take_known():
            for item_id, result in known:
                self._tasks.apply_transcript(item_id, result)
        self._responses.start_deadlines()  # for those still waiting once this input is handled
        return self._core.take_output()

    # ---- client events ----------------------------------------------------------------------------
    def open(self) -> list[Output]:
        self._core.emit({"type": "session.created", "session": self._config.render()})
        self._core.emit(
            {
                "type": "conversation.created",
                "conversation": {"id": self._core.conversation_id, "object": "realtime.conversation"},
            }
        )
        return self._flush()

    def receive_text(self, text: str) -> list[Output]:
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):
            self._core.error(RealtimeError("invalid_json", "The message is not valid JSON."), None)
            return self._flush()
        return self.receive(event)

    def receive(self, event: Any) -> list[Output]:
        """One client event; a bad one yields exactly one ``error`` event and changes nothing."""
        if not isinstance(event, dict):
            self._core.error(
                RealtimeError("invalid_event", f"Expected a JSON object, got {type(event).__name__}."), None
            )
            return self._flush()
        bad = invalid_text_path(event)
        event_id = event.get("event_id") if isinstance(event.get("event_id"), str) and bad != "event_id" else None
        if bad is not None:
            self._core.error(RealtimeError("invalid_value", invalid_text_message(bad), bad or None), event_id)
            return self._flush()
        kind = event.get("type")
        if not isinstance(kind, str):
            self._core.error(RealtimeError("invalid_event", "The 'type' field is missing.", "type"), event_id)
            return self._flush()
        handler = self._handlers.get(kind)
        if handler is None:
            self._core.error(
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
        mark = self._core.mark()
        try:
            handler(event)
        except RealtimeError as err:
            self._core.rollback(mark)
            self._core.error(err, event_id)
        except Exception:
            log.exception("realtime session failed on a client event %r", kind[:64])
            self._core.rollback(mark)
            self._core.emit(
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

    # ---- the detector, the idle timeout, task outcomes and the connection's conditions ----------------
    def on_vad_events(self) -> list[Output]:
        """The detector judged audio already received (off the event loop, batched with other sessions'):
        its events act as if they had come with that audio."""
        self._turns.vad_events()
        return self._flush()

    def on_idle(self) -> list[Output]:
        """Called when ``idle_deadline`` may have passed: the user stayed silent, so commit and reply."""
        self._turns.idle()
        return self._flush()

    def on_transcription(self, item_id: str, result: Transcription) -> list[Output]:
        """The transcription task ``item_id`` finished: a committed turn's transcript, or the speculative
        one of the pause under way, from which the turn's reply is prepared."""
        self._tasks.transcription(item_id, result)
        return self._flush()

    def on_partial_transcription(self, task_id: str, result: Transcription | None) -> list[Output]:
        """A partial transcription of the turn being spoken finished (None: it did not run, or failed)."""
        self._tasks.partial_transcription(task_id, result)
        return self._flush()

    def on_transcription_failed(self, item_id: str, message: str) -> list[Output]:
        self._tasks.transcription_failed(item_id, message)
        return self._flush()

    def on_asr_timeout(self, response_id: str) -> list[Output]:
        """A response waited ``asr_timeout_s`` for transcripts: it goes ahead with the audio as it is."""
        self._responses.asr_timeout(response_id)
        return self._flush()

    def on_prompt_fitted(self, request_id: str, cut: tuple[Message, ...]) -> list[Output]:
        """The generation ``request_id`` left the oldest messages ``cut`` out of its prompt: later prompts
        start there too, until the conversation outgrows the room again."""
        self._responses.prompt_fitted(cut)
        return self._flush()

    def on_chunk(self, request_id: str, chunk: OutputChunk) -> list[Output]:
        self._responses.chunk(request_id, chunk)
        return self._flush()

    def on_stream_end(self, request_id: str, error: str | None = None) -> list[Output]:
        """The backend stream ended: the response ends as its Done said, or failed when the stream broke."""
        self._responses.stream_end(request_id, error)
        return self._flush()

    def on_expired(self) -> list[Output]:
        """The session reached its maximum duration: say so, then close (1001)."""
        self._tasks.expired()
        return self._flush()

    def on_backend_stopped(self) -> list[Output]:
        """The model backend stopped: nothing can be answered any more, so say so and close (1011)."""
        self._tasks.backend_stopped()
        return self._flush()

    def on_client_stalled(self) -> list[Output]:
        """The client stopped reading its events: stop generating for it until it reads again."""
        self._tasks.client_stalled()
        return self._flush()

    def on_client_reading(self) -> list[Output]:
        """The client caught up with its events: responses generate again."""
        self._tasks.client_reading()
        return self._flush()
