"""The input audio of a ``RealtimeSession`` and the turns found in it: the ``input_audio_buffer.*`` client events,
the voice activity detector the settings install and the turns it finds (read while spoken for partial
transcripts; a turn's transcription starts speculatively at a pause; its end commits it and, when the session
answers turns, creates the response) and the idle timeout that answers a user who stays silent. Uses the core,
the items (a committed turn is one) and the responses (a turn interrupts or starts one)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import CancelTask, Prefill, StartTask, Transcribe, VadFactory, new_id
from omni_gateway.gateway.realtime.context import build_request, has_images, recent_frames_only
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_value, missing
from omni_gateway.gateway.realtime.image_output import parse_image_options
from omni_gateway.gateway.realtime.input_audio import Signal, SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped
from omni_gateway.gateway.realtime.items import Content, Item, decode_base64
from omni_gateway.gateway.realtime.partial_transcript import partial_task_id, prefill_task_id
from omni_gateway.gateway.realtime.session_core import SessionCore
from omni_gateway.gateway.realtime.session_items import ConversationItems
from omni_gateway.gateway.realtime.session_responses import Responses
from omni_gateway.gateway.realtime.settings import SessionSettings, apply_response_overrides
from omni_gateway.omni.protocol import AudioPart, InvalidInput, OmniRequest, Transcription

MIN_COMMIT_MS = 100


class InputTurns:
    """The input audio buffer, its voice activity detector and the turns it finds."""

    def __init__(
        self, core: SessionCore, items: ConversationItems, responses: Responses, vad_factory: VadFactory | None
    ) -> None:
        self._core = core
        self._items = items
        self._responses = responses
        self._vad_factory = vad_factory
        self._pending_turn_id: str | None = None  # announced by speech_started, used by the commit
        self._known: list[tuple[str, Transcription]] = []  # adopted transcripts, reported after their commit
        self._prefilling: str | None = None  # the task prefilling the reply of the turn being spoken
        self._heard_bytes = 0  # speech of the turn being spoken that the last prefill heard (a model that hears)

    # ---- the detector -------------------------------------------------------------------------------
    @property
    def can_detect(self) -> bool:
        """Whether this server runs voice activity detection at all."""
        return self._vad_factory is not None

    def install_vad(self, settings: SessionSettings) -> None:
        """Install the detector ``settings`` ask for (none without turn detection)."""
        turn = settings.turn_detection
        if turn is None or self._vad_factory is None:
            self._core.drop_speculation()
            self._core.audio.set_vad(None)
            return
        vad_settings = turn.vad_settings()
        try:
            vad = self._vad_factory(vad_settings)
        except ValueError as exc:  # the detector's own bounds (e.g. a threshold of exactly 0 or 1)
            raise invalid_value(
                "session.turn_detection", "settings the voice activity detector accepts", str(exc)
            ) from None
        except InvalidInput as exc:  # a detector this server cannot build (semantic_vad without its model)
            raise RealtimeError("invalid_value", str(exc), "session.turn_detection.type") from None
        self._core.drop_speculation()  # the new detector starts a new turn
        self._core.audio.set_vad(vad, vad_settings.prefix_padding_ms)

    def take_known(self) -> list[tuple[str, Transcription]]:
        """The transcripts committed turns adopted from their speculation, to report after the commit."""
        known, self._known = self._known, []
        return known

    # ---- input_audio_buffer.* and the detector's signals ----------------------------------------------
    def buffer_append(self, event: dict[str, Any]) -> None:
        core = self._core
        if "audio" not in event:
            raise missing("audio")
        raw = decode_base64(event["audio"], "audio")
        if len(raw) > core.limits.max_append_bytes:
            raise invalid_value(
                "audio", f"at most {core.limits.max_append_bytes} bytes of audio per event", f"{len(raw)} bytes"
            )
        try:
            pcm = audio_fmt.decode(raw, core.settings.input_format)
        except audio_fmt.AudioFormatError as exc:
            raise invalid_value("audio", "audio in the session's input_audio_format", str(exc)) from None
        if core.audio.size + len(pcm) > core.limits.max_buffer_bytes:
            raise RealtimeError(
                "input_audio_buffer_full",
                f"The input audio buffer would exceed {core.limits.max_buffer_bytes} bytes; commit or clear it first.",
                "audio",
            )
        core.idle_spent &= not pcm  # audio the client sent re-arms the idle timeout
        self._take_signals(core.audio.append(pcm))

    def vad_events(self) -> None:
        """The detector judged audio already received: its events act as if they had come with that audio."""
        self._take_signals(self._core.audio.append(b""))

    def _take_signals(self, signals: list[Signal]) -> None:
        for signal in signals:
            if isinstance(signal, SpeechStarted):
                self._speech_started(signal)
            elif isinstance(signal, SpeechPaused):
                self._speech_paused(signal)
            elif isinstance(signal, SpeechResumed):
                self._core.drop_speculation()
            else:
                self._speech_stopped(signal)
        self._read_while_spoken()

    def _read_while_spoken(self) -> None:
        """Transcribe the turn being spoken when enough new speech arrived since its last partial transcript;
        for a model that hears it, prefill its reply with the speech so far as often."""
        item_id = self._pending_turn_id
        if item_id is None:
            return
        speech = self._core.audio.speech_so_far()
        if speech is None:
            return
        if self._core.transcribing and self._core.partials.due(item_id, len(speech)):
            job = self._transcribe_job(item_id, speech)
            self._core.issue(StartTask(partial_task_id(item_id), replace(job, partial=True)))
        every = (self._core.limits.partial_transcript_ms or 0) * audio_fmt.BYTES_PER_MS
        if every and len(speech) - self._heard_bytes >= every and self.prefills_heard_turns():
            self._heard_bytes = len(speech)
            self._prefill_heard(item_id, speech)

    def _prefill_heard(self, item_id: str, speech: bytes) -> None:
        """Prefill the reply the turn ``item_id`` gets if it ends now, its audio marked as still spoken: the
        model hears the part of it that more speech cannot change, so each prefill adds the speech settled
        since the last one and the reply at the turn's end only the rest."""
        reply = self.reply_to(item_id, speech, None)
        if reply is None:
            return
        request = reply[1]
        *earlier, turn = request.messages
        spoken = tuple(replace(p, partial=True) if isinstance(p, AudioPart) else p for p in turn.parts)
        request = replace(request, messages=(*earlier, replace(turn, parts=spoken)))
        work = self._responses.generate(request)
        self.prefill(item_id, Prefill(work.request, work.fit))

    def _speech_paused(self, signal: SpeechPaused) -> None:
        """Start the turn's transcription now: if the pause becomes the stop, the commit reuses it."""
        self._core.drop_speculation()
        if self._pending_turn_id is None or audio_fmt.duration_ms(signal.pcm16) < MIN_COMMIT_MS:
            return
        if self._core.capabilities.hears_audio:
            return  # no transcript to get ahead of: the model hears the turn itself
        job = self._transcribe_job(self._pending_turn_id, signal.pcm16)
        self._core.issue(*self._core.speculation.begin(signal.pause_at, job))
        self._core.audio.expect_words()

    def heard(self, words: str | None) -> None:
        """The pause's speculative transcript is in (None: it failed). semantic_vad weighs the words, and may
        end the turn on them now rather than with the next audio."""
        self._core.audio.hear(words)
        self.vad_events()

    def _speech_started(self, signal: SpeechStarted) -> None:
        self._core.drop_speculation()
        self._pending_turn_id = self._core.new_item_id()
        self._heard_bytes = 0
        self._core.idle_deadline = None
        self._core.emit(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": signal.audio_start_ms,
                "item_id": self._pending_turn_id,
            }
        )
        turn, active = self._core.settings.turn_detection, self._responses.active
        if turn is not None and turn.interrupt_response and active is not None:
            self._responses.cancel(active, "turn_detected")

    def _speech_stopped(self, signal: SpeechStopped) -> None:
        item_id = self._pending_turn_id or self._core.new_item_id()
        self._pending_turn_id = None
        self._core.emit(
            {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": signal.audio_end_ms, "item_id": item_id}
        )
        if self._prefilling is not None:  # the turn's reply computes its own prompt now: the prefill would repeat it
            self._core.issue(CancelTask(self._prefilling))
            self._prefilling = None
        if audio_fmt.duration_ms(signal.pcm16) < MIN_COMMIT_MS:
            self._core.drop_speculation()
            return  # a click, not a turn
        self._commit(signal.pcm16, item_id, pause_at=signal.pause_at)
        self._core.turn_ended(item_id, signal)
        if self.answers_turns():
            self._responses.start({}, turn=item_id)
        self._core.drop_speculation()  # a reply prepared for this turn and not taken up by a response

    def prefill(self, item_id: str, work: Prefill) -> None:
        """Prefill the reply of the turn ``item_id`` being spoken, in place of an earlier prefill of it."""
        self._prefilling = prefill_task_id(item_id)
        self._core.issue(StartTask(self._prefilling, work))

    def prefills_while_spoken(self) -> bool:
        """Whether a partial transcript of the turn being spoken prefills the reply it would get: the reply
        reads the transcript, and a turn's end starts it."""
        return not self._core.capabilities.hears_audio and self._prefills()

    def prefills_heard_turns(self) -> bool:
        """Whether the speech so far of the turn being spoken prefills the reply it would get: the model hears
        a turn while it is spoken, and a turn's end starts the reply."""
        return self._core.capabilities.hears_while_spoken and self._prefills()

    def _prefills(self) -> bool:
        return self._core.limits.prefill_while_speaking and self.answers_turns() and not self._responses.client_stalled

    def reply_to(self, item_id: str, pcm16: bytes, transcript: str | None) -> tuple[Item, OmniRequest] | None:
        """The user turn ``item_id`` as heard, and the request of the reply it gets if it ends now; None when
        that response would fail."""
        heard = Item(
            item_id, "message", role="user", content=[Content("input_audio", audio=pcm16, transcript=transcript)]
        )
        settings = apply_response_overrides(self._core.settings, {}, self._core.dialect)
        context = [*self._core.items, heard]
        if "image" not in self._core.capabilities.input_modalities and has_images(
            recent_frames_only(context, self._core.limits.max_image_frames)
        ):
            return None
        request = build_request(
            new_id("resp"),
            settings,
            context,
            max_image_frames=self._core.limits.max_image_frames,
            image=parse_image_options(None),
        )
        return heard, request

    def answers_turns(self) -> bool:
        """Whether a turn that server VAD ends gets a response of its own right away."""
        turn = self._core.settings.turn_detection
        return (
            turn is not None
            and turn.create_response
            and self._responses.active is None
            and self._core.settings.kind == "realtime"
        )

    def buffer_commit(self, event: dict[str, Any]) -> None:
        ms = audio_fmt.duration_ms(self._core.audio.size)
        if ms < MIN_COMMIT_MS:
            raise RealtimeError(
                "input_audio_buffer_commit_empty",
                "Error committing input audio buffer: buffer too "
                f"small. Expected at least {MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{ms:.2f}ms of audio.",
            )
        self._commit(self._core.audio.take_all(), self._pending_turn_id or self._core.new_item_id())
        self._pending_turn_id = None

    def _commit(self, pcm: bytes, item_id: str, pause_at: int | None = None) -> None:
        """Commit ``pcm`` as a user turn; ``pause_at`` says the speech in it ended at that pause."""
        item = Item(item_id, "message", role="user", content=[Content("input_audio", audio=pcm)])
        previous = self._items.insert(item, None)
        self._core.emit({"type": "input_audio_buffer.committed", "item_id": item.id, "previous_item_id": previous})
        self._items.announce(item, previous)
        self._core.enforce_audio_budget()
        if self._core.capabilities.hears_audio:
            # The model takes the audio itself: responses do not wait for a transcript, which is only
            # computed (alongside) when the session asks for input transcription.
            self._core.drop_speculation()
            if self._core.transcribing:
                self._core.issue(StartTask(item.id, self._transcribe_job(item.id, pcm)))
            return
        self._core.pending_asr.add(item.id)
        out, known = self._core.speculation.commit(self._transcribe_job(item.id, pcm), pause_at)
        self._core.issue(*out)
        if known is not None:
            self._known.append((item.id, known))

    def _transcribe_job(self, item_id: str, pcm: bytes) -> Transcribe:
        transcription = self._core.settings.transcription or {}
        return Transcribe(
            item_id,
            pcm,
            audio_fmt.SAMPLE_RATE,
            language=transcription.get("language"),
            prompt=transcription.get("prompt"),
        )

    def buffer_clear(self, event: dict[str, Any]) -> None:
        self._core.drop_speculation()
        self._core.audio.clear()
        self._pending_turn_id = None
        self._core.emit({"type": "input_audio_buffer.cleared"})

    def idle(self) -> None:
        """Called when ``idle_deadline`` may have passed: the user stayed silent, so commit and reply."""
        core = self._core
        if core.idle_deadline is None or core.now() < core.idle_deadline:
            return
        core.idle_deadline = None
        turn = core.settings.turn_detection
        if (
            turn is None
            or turn.idle_timeout_ms is None
            or self._responses.active is not None
            or core.audio.in_speech
            or core.idle_spent
        ):
            return
        core.idle_spent = True
        # the silent stretch since the reply played out, as OpenAI reports it: about idle_timeout_ms long
        start = min(core.idle_from, core.audio.end)
        start_ms, end_ms = start // audio_fmt.BYTES_PER_MS, core.audio.end // audio_fmt.BYTES_PER_MS
        item_id = core.new_item_id()
        core.emit(
            {
                "type": "input_audio_buffer.timeout_triggered",
                "audio_start_ms": start_ms,
                "audio_end_ms": end_ms,
                "item_id": item_id,
            }
        )
        silence = core.audio.take_since(start)
        if audio_fmt.duration_ms(silence) >= MIN_COMMIT_MS:
            self._commit(silence, item_id)
        self._responses.start({})
