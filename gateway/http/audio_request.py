"""Bodies of /v1/audio/speech and /v1/audio/transcriptions -> validated options. Pure.

The server has one speech recogniser and one voice model, so the ``model`` field of the audio endpoints
is required (as in OpenAI's API) but any name selects them: clients written for ``whisper-1`` or
``tts-1`` work unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.errors import invalid
from omni_gateway.gateway.http.fields import get_float, get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import AudioOutputOptions, Capabilities

SPEECH_FORMATS = ("wav", "pcm", "flac")
UNSUPPORTED_SPEECH_FORMATS = ("mp3", "opus", "aac")
TRANSCRIPTION_FORMATS = ("json", "text", "verbose_json")
SPEECH_SAMPLE_RATE = 24000


@dataclass(frozen=True, slots=True)
class SpeechCall:
    text: str
    options: AudioOutputOptions
    response_format: str
    sse: bool


@dataclass(frozen=True, slots=True)
class TranscriptionCall:
    language: str | None
    prompt: str | None
    response_format: str


def parse_speech(body: object, caps: Capabilities, limits: HttpLimits) -> SpeechCall:
    body = require_object(body, "body")
    if "audio" not in caps.output_modalities:
        raise invalid("this server has no speech synthesis configured.", "model", "unsupported_modality")
    get_str(body, "model", required=True)
    text = get_str(body, "input", required=True, max_len=limits.max_speech_chars)
    if not text.strip():
        raise invalid("'input' must contain text to speak.", "input")
    voice = get_str(body, "voice", required=True)
    if not caps.offers_voice(voice):
        raise invalid(f"'voice' must be one of {', '.join(caps.voices)}, got {shown(voice)}.", "voice")
    fmt = get_str(body, "response_format", "wav")
    if fmt in UNSUPPORTED_SPEECH_FORMATS:
        raise invalid(
            f"'response_format' {shown(fmt)} is not supported by this server; use one of {', '.join(SPEECH_FORMATS)}.",
            "response_format",
            "unsupported_parameter",
        )
    fmt = get_str(body, "response_format", "wav", choices=SPEECH_FORMATS)
    speed = get_float(body, "speed", 1.0, lo=0.25, hi=4.0)
    stream_format = get_str(body, "stream_format", "audio", choices=("audio", "sse"))
    if stream_format == "sse" and fmt == "flac":
        raise invalid('\'stream_format\' "sse" needs \'response_format\' "pcm" or "wav".', "stream_format")
    return SpeechCall(
        text=text,
        options=AudioOutputOptions(voice=voice, sample_rate=SPEECH_SAMPLE_RATE, speed=speed),
        response_format=fmt,
        sse=stream_format == "sse",
    )


def parse_transcription_form(form: Mapping[str, object], caps: Capabilities) -> TranscriptionCall:
    """The text fields of the multipart upload; the file itself is checked by the handler."""
    if "audio" not in caps.input_modalities:
        raise invalid("this server has no speech recognition configured.", "model", "unsupported_modality")
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    get_str(fields, "model", required=True)
    response_format = get_str(fields, "response_format", "json")
    if response_format not in TRANSCRIPTION_FORMATS:
        raise invalid(
            f"'response_format' must be one of {', '.join(TRANSCRIPTION_FORMATS)}, got {shown(response_format)}.",
            "response_format",
        )
    language = get_str(fields, "language", max_len=16)
    return TranscriptionCall(
        language=language or None,
        prompt=get_str(fields, "prompt", max_len=4096) or None,
        response_format=response_format,
    )
