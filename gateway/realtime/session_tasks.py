"""A ``RealtimeSession``'s transcripts and the connection's conditions: a committed turn's transcript (or its
failure), the partial ones of a turn being spoken, the speculative one of a pause, which prepares the turn's
reply; the session's expiry, a stopped backend, a client that stopped reading. Uses the core, the responses
(a transcript lets the responses waiting for it generate) and the input turns (whether a turn gets a reply)."""

from __future__ import annotations

from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL,
    Close,
    Prefill,
    Transcribe,
)
from omni_gateway.gateway.realtime.partial_transcript import PARTIAL_SUFFIX
from omni_gateway.gateway.realtime.session_audio import InputTurns
from omni_gateway.gateway.realtime.session_core import SessionCore
from omni_gateway.gateway.realtime.session_responses import Responses
from omni_gateway.omni.protocol import Transcription


class TaskOutcomes:
    """What the connection reports besides client events and the backend's output."""

    def __init__(self, core: SessionCore, responses: Responses, turns: InputTurns) -> None:
        self._core = core
        self._responses = responses
        self._turns = turns

    # ---- the connection's conditions ------------------------------------------------------------------
    def expired(self) -> None:
        """The session reached its maximum duration: say so, then close (1001)."""
        message = f"Your session hit the maximum duration of {self._core.limits.session_seconds // 60} minutes."
        self._core.emit(
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
        self._core.issue(Close(CLOSE_GOING_AWAY, message))

    def backend_stopped(self) -> None:
        """The model backend stopped: nothing can be answered any more, so say so and close (1011)."""
        self._core.emit(
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
        self._core.issue(Close(CLOSE_INTERNAL, "model backend stopped"))

    def client_stalled(self) -> None:
        """The client stopped reading its events: stop generating for it until it reads again. Its
        responses fail (the client sees why if it does) and any speculative reply is dropped."""
        self._responses.client_stopped_reading()
        self._core.drop_speculation()

    def client_reading(self) -> None:
        """The client caught up with its events: responses generate again."""
        self._responses.client_reading()

    # ---- transcripts -----------------------------------------------------------------------------------
    def transcription(self, item_id: str, result: Transcription) -> None:
        """The transcription task ``item_id`` finished: a committed turn's transcript, or the speculative
        one of the pause under way, from which the turn's reply is prepared."""
        job = self._core.speculation.hold(item_id, result)
        if job is None:
            self.apply_transcript(item_id, result)
            return
        if result.text.strip() and self._turns.answers_turns() and not self._responses.client_stalled:
            self._prepare_reply(job, result)
        self._turns.heard(result.text)

    def partial_transcription(self, task_id: str, result: Transcription | None) -> None:
        """A partial transcription of the turn being spoken finished (None: it did not run, or failed)."""
        item_id = task_id.removesuffix(PARTIAL_SUFFIX)
        if result is None:
            self._core.partials.skipped(item_id)
            return
        self._send_delta(item_id, self._core.partials.result(item_id, result.text))
        if result.text.strip() and self._turns.prefills_while_spoken() and self._core.items.get(item_id) is None:
            # the turn is still being spoken (its item comes with the commit): prefill its reply as read so far
            reply = self._turns.reply_to(item_id, b"", result.text)
            if reply is not None:
                work = self._responses.generate(reply[1])
                self._turns.prefill(item_id, Prefill(work.request, work.fit))

    def _send_delta(self, item_id: str, delta: str) -> None:
        if delta and self._core.transcribing:
            self._core.emit(
                {
                    "type": "conversation.item.input_audio_transcription.delta",
                    "item_id": item_id,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": None,
                }
            )

    def apply_transcript(self, item_id: str, result: Transcription) -> None:
        """The transcript of the committed turn ``item_id`` is in: record it, report it, release its waiters."""
        item = self._core.items.get(item_id)
        if item is not None and item.content and item.content[0].type == "input_audio":
            item.content[0].transcript = result.text
        self._send_delta(item_id, self._core.partials.final(item_id, result.text))
        if self._core.transcribing:
            seconds = result.duration_s or (audio_fmt.duration_ms(item.content[0].audio or b"") / 1000 if item else 0.0)
            self._core.emit(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": item_id,
                    "content_index": 0,
                    "transcript": result.text,
                    "logprobs": None,
                    "usage": {"type": "duration", "seconds": round(seconds, 3)},
                }
            )
        self._responses.transcript_in(item_id)

    def _prepare_reply(self, job: Transcribe, result: Transcription) -> None:
        """Start the reply the paused turn gets if it ends now, from the conversation as it would then be."""
        reply = self._turns.reply_to(job.item_id, job.pcm16, result.text)
        if reply is not None:
            heard, request = reply
            self._core.issue(*self._core.speculation.prepare(heard, self._responses.generate(request)))

    def transcription_failed(self, item_id: str, message: str) -> None:
        retry = self._core.speculation.failed(item_id)
        if retry is not None:  # a speculation's: the committed audio is transcribed afresh when it counts
            self._core.issue(*retry)
            if not retry:  # the pause's own: its turn is judged by sound alone
                self._turns.heard(None)
            return
        if self._core.transcribing:
            self._core.emit(
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
        self._responses.transcript_in(item_id)
