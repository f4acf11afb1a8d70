"""The input audio of a ``RealtimeSession``: the ``input_audio_buffer.*`` client events, the turns server VAD
finds in the buffer (read while spoken for partial transcripts; a turn's transcription starts speculatively at
a pause; its end commits it and, when the session answers turns, creates the response) and the idle timeout
that answers a user who stays silent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import Output, SessionLimits, StartTask, Transcribe
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_value, missing
from omni_gateway.gateway.realtime.input_audio import (
    InputAudioBuffer,
    Signal,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
)
from omni_gateway.gateway.realtime.items import Content, Item, decode_base64
from omni_gateway.gateway.realtime.partial_transcript import PartialTranscripts, partial_task_id
from omni_gateway.gateway.realtime.response import Event
from omni_gateway.gateway.realtime.settings import SessionSettings
from omni_gateway.gateway.realtime.speculation import TurnSpeculation
from omni_gateway.omni.protocol import Capabilities, Transcription

MIN_COMMIT_MS = 100


class InputTurns:
    """Part of ``RealtimeSession``, which holds the state named below."""

    limits: SessionLimits
    settings: SessionSettings
    capabilities: Capabilities
    audio: InputAudioBuffer
    idle_deadline: float | None
    _now: Callable[[], float]
    _idle_spent: bool
    _idle_from: int
    _pending_turn_id: str | None
    _pending_asr: set[str]
    _known: list[tuple[str, Transcription]]
    _speculation: TurnSpeculation
    _partials: PartialTranscripts
    _active: str | None
    _out: list[Output]

    if TYPE_CHECKING:

        def _emit(self, event: Event) -> None: ...
        def _flush(self) -> list[Output]: ...
        def _new_item_id(self) -> str: ...
        def _insert(self, item: Item, previous_item_id: str | None) -> str | None: ...
        def _announce(self, item: Item, previous: str | None) -> None: ...
        def _enforce_audio_budget(self) -> None: ...
        def _cancel(self, response_id: str, reason: str) -> None: ...
        def _start_response(self, params: dict[str, Any]) -> None: ...
        @property
        def _transcribing(self) -> bool: ...

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
        self._take_signals(self.audio.append(pcm))

    def on_vad_events(self) -> list[Output]:
        """The detector judged audio already received (off the event loop, batched with other sessions'):
        its events act as if they had come with that audio."""
        self._take_signals(self.audio.append(b""))
        return self._flush()

    def _take_signals(self, signals: list[Signal]) -> None:
        for signal in signals:
            if isinstance(signal, SpeechStarted):
                self._speech_started(signal)
            elif isinstance(signal, SpeechPaused):
                self._speech_paused(signal)
            elif isinstance(signal, SpeechResumed):
                self._drop_speculation()
            else:
                self._speech_stopped(signal)
        self._read_while_spoken()

    def _read_while_spoken(self) -> None:
        """Transcribe the turn being spoken when enough new speech arrived since its last partial transcript."""
        item_id = self._pending_turn_id
        if item_id is None or not self._transcribing:
            return
        speech = self.audio.speech_so_far()
        if speech is None or not self._partials.due(item_id, len(speech)):
            return
        job = self._transcribe_job(item_id, speech)
        self._out.append(StartTask(partial_task_id(item_id), replace(job, partial=True)))

    def _speech_paused(self, signal: SpeechPaused) -> None:
        """Start the turn's transcription now: if the pause becomes the stop, the commit reuses it."""
        self._drop_speculation()
        if self._pending_turn_id is None or audio_fmt.duration_ms(signal.pcm16) < MIN_COMMIT_MS:
            return
        if self.capabilities.hears_audio:
            return  # no transcript to get ahead of: the model hears the turn itself
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
        self._enforce_audio_budget()
        if self.capabilities.hears_audio:
            # The model takes the audio itself: responses do not wait for a transcript, which is only
            # computed (alongside) when the session asks for input transcription.
            self._out += self._speculation.drop()
            if self._transcribing:
                self._out.append(StartTask(item.id, self._transcribe_job(item.id, pcm)))
            return
        self._pending_asr.add(item.id)
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
        # the silent stretch since the reply played out, as OpenAI reports it: about idle_timeout_ms long
        start = min(self._idle_from, self.audio.end)
        start_ms, end_ms = start // audio_fmt.BYTES_PER_MS, self.audio.end // audio_fmt.BYTES_PER_MS
        item_id = self._new_item_id()
        self._emit(
            {
                "type": "input_audio_buffer.timeout_triggered",
                "audio_start_ms": start_ms,
                "audio_end_ms": end_ms,
                "item_id": item_id,
            }
        )
        silence = self.audio.take_since(start)
        if audio_fmt.duration_ms(silence) >= MIN_COMMIT_MS:
            self._commit(silence, item_id)
        self._start_response({})
        return self._flush()
