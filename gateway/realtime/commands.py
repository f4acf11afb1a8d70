"""What the session hands to its I/O layer: events to send and tasks to start or cancel, plus its limits.

Every piece of backend work is a task the session names: ``StartTask`` runs it, ``CancelTask`` stops it
(a generation's backend request is aborted), and its outcome comes back to the session under the same
id (``on_transcription``/``on_transcription_failed``, ``on_partial_transcription``,
``on_prompt_fitted``/``on_chunk``/``on_stream_end``, ``on_asr_timeout``). Task ids are unique among the
running tasks; an outcome for an id the session no longer tracks is ignored.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni_gateway.gateway.realtime.truncation import PromptFit
from omni_gateway.omni.protocol import OmniRequest, VadSettings, VoiceActivityDetector

_ALPHABET = (string.ascii_letters + string.digits).encode()
# Random bytes become id characters in one translate: a byte below 248 (4 x 62) maps to the alphabet evenly,
# the 8 above it are dropped, so every character stays uniform. Every event gets an id, and drawing them a
# character at a time (secrets.choice) cost more than the rest of an audio delta's event.
_TO_ALPHABET = bytes(_ALPHABET[b % len(_ALPHABET)] for b in range(256))
_UNEVEN = bytes(range(len(_ALPHABET) * 4, 256))
_ID_CHARS = 20


@dataclass(frozen=True, slots=True)
class Send:
    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Transcribe:
    """Transcribe a turn's audio; the task id is the item id the transcript belongs to. A ``partial`` one
    reads the turn while it is spoken (task id ``<item id>:partial``): it runs only when no other
    transcription is under way, so it never delays a final one, and its outcome is
    ``on_partial_transcription``."""

    item_id: str
    pcm16: bytes
    sample_rate: int
    language: str | None = None
    prompt: str | None = None
    partial: bool = False


@dataclass(frozen=True, slots=True)
class Generate:
    """Fit ``request``'s prompt into the context window (``fit``, CPU work kept off the event loop; None:
    sent as it is), then stream the backend's chunks; the task id is the request id."""

    request: OmniRequest
    fit: PromptFit | None = None


@dataclass(frozen=True, slots=True)
class Prefill:
    """Compute ``request``'s prompt into the backend's prefix cache and nothing more: the reply of a turn still
    being spoken, read (its partial transcript) or heard (its audio so far, ``AudioPart.partial``) as far as it
    went, so that the turn's reply finds that work done and prefills only what was said since. The task id is
    ``<item id>:prefill``; it reports no outcome."""

    request: OmniRequest
    fit: PromptFit | None = None


@dataclass(frozen=True, slots=True)
class AsrDeadline:
    """Report ``on_asr_timeout(response_id)`` after ``seconds``, unless cancelled first."""

    response_id: str
    seconds: float


Work = Transcribe | Generate | Prefill | AsrDeadline


@dataclass(frozen=True, slots=True)
class StartTask:
    task_id: str
    work: Work


@dataclass(frozen=True, slots=True)
class CancelTask:
    task_id: str


@dataclass(frozen=True, slots=True)
class Close:
    """End the connection with this WebSocket close code, after the events queued before it."""

    code: int
    reason: str


Output = Send | StartTask | CancelTask | Close

CLOSE_GOING_AWAY = 1001
CLOSE_INTERNAL = 1011


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_append_bytes: int = 15 * 1024 * 1024  # decoded bytes per input_audio_buffer.append (OpenAI's cap)
    max_buffer_bytes: int = 64 * 1024 * 1024  # 24 kHz pcm16 held in the input buffer
    max_items: int = 4096
    session_seconds: int = 3600
    max_conversation_audio_bytes: int = 128 * 1024 * 1024  # audio kept in items; the oldest is dropped first
    max_image_bytes: int = 10 * 1024 * 1024  # one decoded input_image
    max_image_frames: int = 2  # image-only user items sent to the model (a webcam stream): the most recent
    max_conversation_image_bytes: int = 64 * 1024 * 1024  # input images kept in items; the oldest is dropped first
    max_responses: int = 4  # concurrent responses (out-of-band ones overlap); beyond it a response fails at once
    asr_timeout_s: float = 30.0  # a response waits at most this long for its turn's transcript
    partial_transcript_ms: int | None = 1000  # speech between partial transcripts of a turn being spoken (None: none)
    # A model that reads transcripts prefills the reply's prompt from each partial transcript the session
    # computes (for a client that asked for input transcription), so a turn's end leaves only its last words
    # to prefill. No reading runs for it alone: on a small machine the recognizer's time costs more than the
    # prefill it saves. A model that hears a turn while it is spoken (Capabilities.hears_while_spoken) gets
    # the speech so far each partial_transcript_ms of it instead, so a turn's end leaves its last audio
    # window to encode and prefill.
    prefill_while_speaking: bool = True


def new_id(prefix: str) -> str:
    while True:  # 32 bytes give fewer than 20 characters once in some 10^11 draws
        chars = secrets.token_bytes(32).translate(_TO_ALPHABET, _UNEVEN)
        if len(chars) >= _ID_CHARS:
            return prefix + "_" + chars[:_ID_CHARS].decode()


VadFactory = Callable[[VadSettings], VoiceActivityDetector]
