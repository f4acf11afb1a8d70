"""The effective session configuration: parsed from GA (nested) or beta (flat) updates, rendered back.

One canonical ``SessionSettings`` lives in the session; ``session.update`` produces a new one through
``apply_update`` and ``session.updated`` always echoes the whole of it, as OpenAI does.

Which fields a client may send (the table is ``schema.FIELDS``):

- GA dialect: strict, as OpenAI's GA server. A key of ``session`` (in ``session.update``) or of
  ``response`` (in ``response.create``), or of any object nested in them, that the GA schema lacks is
  refused with an ``invalid_request_error`` whose ``code`` is ``unknown_parameter`` and whose ``param``
  names it (``session.temperature``), and nothing changes. Beta-only spellings (``modalities``, a
  top-level ``voice``, ``temperature``, ``input_audio_format``, ...) are such keys. The read-only fields
  of ``session.created`` (``id``, ``object``, ``expires_at``) may be sent back and are ignored.
- Beta dialect: tolerant, as the beta API that pipecat and older SDKs were written against: unknown
  keys are ignored, except the GA spellings of fields the beta dialect names otherwise
  (``output_modalities``, ``max_output_tokens``, ``audio``), which are refused with ``unknown_parameter``
  and a message naming the beta spelling, since ignoring them would silently drop what the client asked.
- Both: every field that is read is validated (``invalid_type`` / ``invalid_value``, naming the field).
  ``include`` is null or a list of ``item.input_audio_transcription.logprobs``; ``tracing`` is null,
  ``"auto"`` or ``{workflow_name, group_id, metadata}`` (stored and echoed); ``prompt`` (GA) may only be
  null: this server has no reusable prompts, so a prompt object is refused with ``unsupported_parameter``.
  ``parallel_tool_calls`` and ``reasoning`` (GA; OpenAI's reasoning models only) pass as false and null only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from omni_gateway.gateway.realtime.audio import AudioFormat
from omni_gateway.gateway.realtime.errors import invalid_value
from omni_gateway.gateway.realtime.options import (
    parse_include,
    parse_noise_reduction,
    parse_prompt,
    parse_tracing,
    parse_transcription,
    refuse_reasoning_options,
)
from omni_gateway.gateway.realtime.schema import RC, SU, reject_unknown, unknown_parameter
from omni_gateway.gateway.realtime.setting_fields import (
    TurnDetection,
    expect,
    parse_beta_format,
    parse_ga_format,
    parse_max_tokens,
    parse_modalities,
    parse_speed,
    parse_temperature,
    parse_tool_choice,
    parse_tools,
    parse_turn_detection,
    parse_voice,
    render_ga_format,
)
from omni_gateway.gateway.realtime.truncation import parse_truncation

__all__ = [  # TurnDetection and render_ga_format live in setting_fields; the session imports them from here
    "Dialect",
    "SessionSettings",
    "TurnDetection",
    "apply_response_overrides",
    "apply_transcription_update",
    "apply_update",
    "render_ga_format",
    "render_session",
    "validate_choice",
]

Dialect = Literal["ga", "beta"]


@dataclass(frozen=True, slots=True)
class SessionSettings:
    model: str
    kind: Literal["realtime", "transcription"] = "realtime"  # transcription: turns are transcribed, never answered
    # ("text",) or ("audio",): audio always carries a transcript. A response may add "image" (an extension).
    output_modalities: tuple[str, ...] = ("audio",)
    instructions: str = ""
    voice: str = "alloy"
    input_format: AudioFormat = "pcm16"
    output_format: AudioFormat = "pcm16"
    transcription: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    max_output_tokens: int | Literal["inf"] = "inf"
    temperature: float | None = None  # beta only; None leaves the server's sampling default
    speed: float = 1.0
    tracing: str | dict[str, Any] | None = None
    truncation: Any = "auto"
    include: list[str] | None = None

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.output_modalities

    @property
    def wants_image(self) -> bool:
        return "image" in self.output_modalities


# ---- session.update -----------------------------------------------------------------------------
def apply_update(current: SessionSettings, update: Any, dialect: Dialect) -> SessionSettings:
    """A partial update merged over ``current``; raises RealtimeError naming the offending field."""
    expect(update, dict, "session", "an object")
    if "model" in update:
        expect(update["model"], str, "session.model", "a string")  # SessionCore.chosen_model says which it is
    if dialect == "ga":
        reject_unknown(update, "session", SU, "ga")
        refuse_reasoning_options(update, "session")
        return _apply_ga(current, update)
    _reject_ga_spellings(update, "session", _BETA_SESSION_SPELLING)
    return _apply_beta(current, update)


# GA names a beta client might send by mistake -> the beta spelling that has their effect.
_BETA_SESSION_SPELLING = {
    "output_modalities": "modalities",
    "max_output_tokens": "max_response_output_tokens",
    "audio": "input_audio_format, output_audio_format, voice, speed, turn_detection",
}
_BETA_RESPONSE_SPELLING = {
    "output_modalities": "modalities",
    "max_output_tokens": "max_response_output_tokens",
    "audio": "voice, output_audio_format",
}


def _reject_ga_spellings(update: dict[str, Any], prefix: str, spelling: dict[str, str]) -> None:
    for key, beta in spelling.items():
        if key in update:
            error = unknown_parameter(f"{prefix}.{key}")
            error.message += f" This session speaks the beta dialect: use '{beta}' instead."
            raise error


def _apply_common(update: dict[str, Any], changes: dict[str, Any], prefix: str) -> None:
    if "instructions" in update:
        changes["instructions"] = expect(update["instructions"], str, f"{prefix}.instructions", "a string")
    if "tools" in update:
        changes["tools"] = parse_tools(update["tools"], f"{prefix}.tools")
    if "tool_choice" in update:
        changes["tool_choice"] = parse_tool_choice(update["tool_choice"], f"{prefix}.tool_choice")


def _apply_ga(current: SessionSettings, update: dict[str, Any]) -> SessionSettings:
    kind = update.get("type", current.kind)
    if kind not in ("realtime", "transcription"):
        raise invalid_value("session.type", "'realtime' or 'transcription'", kind)
    changes: dict[str, Any] = {"kind": kind}
    _apply_common(update, changes, "session")
    if "output_modalities" in update:
        changes["output_modalities"] = parse_modalities(update["output_modalities"], "session.output_modalities")
    if "max_output_tokens" in update:
        changes["max_output_tokens"] = parse_max_tokens(update["max_output_tokens"], "session.max_output_tokens")
    if "truncation" in update:
        parse_truncation(update["truncation"])  # rejects what the prompt fit could not apply
        changes["truncation"] = update["truncation"]
    if "tracing" in update:
        changes["tracing"] = parse_tracing(update["tracing"], "session.tracing")
    if "include" in update:
        changes["include"] = parse_include(update["include"], "session.include")
    if "prompt" in update:
        parse_prompt(update["prompt"], "session.prompt")
    audio = expect(update.get("audio", {}), dict, "session.audio", "an object")
    audio_in = expect(audio.get("input", {}), dict, "session.audio.input", "an object")
    audio_out = expect(audio.get("output", {}), dict, "session.audio.output", "an object")
    if "format" in audio_in:
        changes["input_format"] = parse_ga_format(audio_in["format"], "session.audio.input.format")
    if "transcription" in audio_in:
        changes["transcription"] = parse_transcription(audio_in["transcription"], "session.audio.input.transcription")
    if "noise_reduction" in audio_in:
        changes["noise_reduction"] = parse_noise_reduction(
            audio_in["noise_reduction"], "session.audio.input.noise_reduction"
        )
    if "turn_detection" in audio_in:
        changes["turn_detection"] = parse_turn_detection(
            audio_in["turn_detection"], "session.audio.input.turn_detection", current.turn_detection
        )
    if "format" in audio_out:
        changes["output_format"] = parse_ga_format(audio_out["format"], "session.audio.output.format")
    if "voice" in audio_out:
        changes["voice"] = parse_voice(audio_out["voice"], "session.audio.output.voice")
    if "speed" in audio_out:
        changes["speed"] = parse_speed(audio_out["speed"], "session.audio.output.speed")
    return replace(current, **changes)


def apply_transcription_update(current: SessionSettings, update: Any) -> SessionSettings:
    """Beta ``transcription_session.update``: the input side of a session that only transcribes."""
    expect(update, dict, "session", "an object")
    allowed = {
        k: update[k]
        for k in (
            "input_audio_format",
            "input_audio_transcription",
            "turn_detection",
            "input_audio_noise_reduction",
            "include",
        )
        if k in update
    }
    return replace(_apply_beta(current, allowed), kind="transcription")


def _apply_beta(current: SessionSettings, update: dict[str, Any]) -> SessionSettings:
    changes: dict[str, Any] = {}
    _apply_common(update, changes, "session")
    if "modalities" in update:
        changes["output_modalities"] = parse_modalities(update["modalities"], "session.modalities")
    if "voice" in update:
        changes["voice"] = parse_voice(update["voice"], "session.voice")
    if "input_audio_format" in update:
        changes["input_format"] = parse_beta_format(update["input_audio_format"], "session.input_audio_format")
    if "output_audio_format" in update:
        changes["output_format"] = parse_beta_format(update["output_audio_format"], "session.output_audio_format")
    if "input_audio_transcription" in update:
        changes["transcription"] = parse_transcription(
            update["input_audio_transcription"], "session.input_audio_transcription"
        )
    if "input_audio_noise_reduction" in update:
        changes["noise_reduction"] = parse_noise_reduction(
            update["input_audio_noise_reduction"], "session.input_audio_noise_reduction"
        )
    if "turn_detection" in update:
        changes["turn_detection"] = parse_turn_detection(
            update["turn_detection"], "session.turn_detection", current.turn_detection
        )
    if "temperature" in update:
        changes["temperature"] = parse_temperature(update["temperature"], "session.temperature")
    if "max_response_output_tokens" in update:
        changes["max_output_tokens"] = parse_max_tokens(
            update["max_response_output_tokens"], "session.max_response_output_tokens"
        )
    if "speed" in update:
        changes["speed"] = parse_speed(update["speed"], "session.speed")
    if "include" in update:
        changes["include"] = parse_include(update["include"], "session.include")
    if "tracing" in update:
        changes["tracing"] = parse_tracing(update["tracing"], "session.tracing")
    return replace(current, **changes)


# ---- response.create overrides -----------------------------------------------------------------
def apply_response_overrides(current: SessionSettings, response: dict[str, Any], dialect: Dialect) -> SessionSettings:
    """Per-response overrides: the same fields as the session, under the response's own names."""
    changes: dict[str, Any] = {}
    if dialect == "ga":
        reject_unknown(response, "response", RC, "ga")
        refuse_reasoning_options(response, "response")
    else:
        _reject_ga_spellings(response, "response", _BETA_RESPONSE_SPELLING)
    _apply_common(response, changes, "response")
    if dialect == "ga":
        if "prompt" in response:
            parse_prompt(response["prompt"], "response.prompt")
        if "output_modalities" in response:
            changes["output_modalities"] = parse_modalities(
                response["output_modalities"], "response.output_modalities", allow_image=True
            )
        if "max_output_tokens" in response:
            changes["max_output_tokens"] = parse_max_tokens(response["max_output_tokens"], "response.max_output_tokens")
        audio = expect(response.get("audio", {}), dict, "response.audio", "an object")
        audio_out = expect(audio.get("output", {}), dict, "response.audio.output", "an object")
        if "format" in audio_out:
            changes["output_format"] = parse_ga_format(audio_out["format"], "response.audio.output.format")
        if "voice" in audio_out:
            changes["voice"] = parse_voice(audio_out["voice"], "response.audio.output.voice")
    else:
        if "modalities" in response:
            changes["output_modalities"] = parse_modalities(
                response["modalities"], "response.modalities", allow_image=True
            )
        if "max_response_output_tokens" in response:
            changes["max_output_tokens"] = parse_max_tokens(
                response["max_response_output_tokens"], "response.max_response_output_tokens"
            )
        if "voice" in response:
            changes["voice"] = parse_voice(response["voice"], "response.voice")
        if "output_audio_format" in response:
            changes["output_format"] = parse_beta_format(
                response["output_audio_format"], "response.output_audio_format"
            )
        if "temperature" in response:
            changes["temperature"] = parse_temperature(response["temperature"], "response.temperature")
    return replace(current, **changes)


# ---- rendering --------------------------------------------------------------------------------
def render_session(s: SessionSettings, dialect: Dialect, session_id: str, expires_at: int) -> dict[str, Any]:
    turn = s.turn_detection.render() if s.turn_detection else None
    if s.kind == "transcription":
        if dialect == "beta":
            return {
                "id": session_id,
                "object": "realtime.transcription_session",
                "input_audio_format": s.input_format,
                "input_audio_transcription": s.transcription,
                "turn_detection": turn,
                "input_audio_noise_reduction": s.noise_reduction,
                "include": s.include,
                "expires_at": expires_at,
            }
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": session_id,
            "expires_at": expires_at,
            "include": s.include,
            "audio": {
                "input": {
                    "format": render_ga_format(s.input_format),
                    "transcription": s.transcription,
                    "noise_reduction": s.noise_reduction,
                    "turn_detection": turn,
                }
            },
        }
    if dialect == "beta":
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": s.model,
            "modalities": ["text", "audio"] if s.wants_audio else ["text"],
            "instructions": s.instructions,
            "voice": s.voice,
            "input_audio_format": s.input_format,
            "output_audio_format": s.output_format,
            "input_audio_transcription": s.transcription,
            "input_audio_noise_reduction": s.noise_reduction,
            "turn_detection": turn,
            "tools": list(s.tools),
            "tool_choice": s.tool_choice,
            "temperature": s.temperature,
            "max_response_output_tokens": s.max_output_tokens,
            "speed": s.speed,
            "expires_at": expires_at,
            "include": s.include,
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": s.model,
        "output_modalities": list(s.output_modalities),
        "instructions": s.instructions,
        "tools": list(s.tools),
        "tool_choice": s.tool_choice,
        "max_output_tokens": s.max_output_tokens,
        "tracing": s.tracing,
        "truncation": s.truncation,
        "prompt": None,
        "expires_at": expires_at,
        "include": s.include,
        "audio": {
            "input": {
                "format": render_ga_format(s.input_format),
                "transcription": s.transcription,
                "noise_reduction": s.noise_reduction,
                "turn_detection": turn,
            },
            "output": {"format": render_ga_format(s.output_format), "voice": s.voice, "speed": s.speed},
        },
    }


def validate_choice(value: Any, allowed: tuple[str, ...], param: str) -> str:
    if value not in allowed:
        raise invalid_value(param, " or ".join(repr(a) for a in allowed), value)
    return cast(str, value)
