"""What the session hands to its I/O layer: events to send and commands to carry out, plus its limits."""
from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni_gateway.omni.protocol import OmniRequest, VadSettings, VoiceActivityDetector

_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class Send:
    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StartResponse:
    response_id: str
    wait_for: tuple[str, ...] = ()  # items whose transcription should land before the request is built
    prepared: bool = False  # stream the reply ``Prepare`` started under this response id, not a new one


@dataclass(frozen=True, slots=True)
class CancelResponse:
    response_id: str


@dataclass(frozen=True, slots=True)
class Transcribe:
    item_id: str
    pcm16: bytes
    sample_rate: int
    language: str | None = None
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class Speculate:
    """Transcribe a turn's audio up to a pause in the background, before the turn is committed.

    The result is held for ``AdoptSpeculation`` and reported nowhere else; ``job.item_id`` is the id
    the turn will be committed under, and keys the speculation.
    """

    job: Transcribe


@dataclass(frozen=True, slots=True)
class DropSpeculation:
    """Speech resumed (or the turn went away): the speculative transcript of ``item_id`` is stale, and so
    is any reply prepared from it."""

    item_id: str


@dataclass(frozen=True, slots=True)
class Prepare:
    """Start generating ``request`` now, holding its output: it is the reply the server-VAD turn
    ``item_id`` gets if the pause its speculative transcript came from turns out to be the end of the
    turn. A ``StartResponse`` with ``prepared`` streams it; a ``DropSpeculation`` of ``item_id`` discards it."""

    item_id: str
    request: OmniRequest


@dataclass(frozen=True, slots=True)
class AdoptSpeculation:
    """The committed turn ``job`` holds the same speech as its speculation: report that transcript as
    ``job``'s result, and carry out ``job`` itself only when the speculation failed or is gone."""

    job: Transcribe


Output = Send | StartResponse | CancelResponse | Transcribe | Speculate | DropSpeculation | AdoptSpeculation | Prepare


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


def new_id(prefix: str) -> str:
    return prefix + "_" + "".join(secrets.choice(_ALPHABET) for _ in range(20))


VadFactory = Callable[[VadSettings], VoiceActivityDetector]
