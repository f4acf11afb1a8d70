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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from omni_gateway.gateway.realtime.audio import AUDIO_FORMATS, SAMPLE_RATE, AudioFormat
from omni_gateway.gateway.realtime.errors import invalid_type, invalid_value
from omni_gateway.gateway.realtime.options import (
    parse_include,
    parse_noise_reduction,
    parse_prompt,
    parse_tracing,
    parse_transcription,
)
from omni_gateway.gateway.realtime.schema import MAX_OUTPUT_TOKENS_CAP, RC, SU, reject_unknown, unknown_parameter
from omni_gateway.gateway.realtime.truncation import parse_truncation
from omni_gateway.omni.protocol import VadSettings

Dialect = Literal["ga", "beta"]

# semantic_vad has no semantic model behind it here: its eagerness picks how long a pause ends the turn.
EAGERNESS_SILENCE_MS = {"low": 1500, "medium": 800, "auto": 800, "high": 400}
MAX_TURN_MS = 10_000  # prefix_padding_ms and silence_duration_ms: beyond it a turn would never end in practice
TEMPERATURE = (0.6, 1.2)  # beta temperature, inclusive
IDLE_TIMEOUT_MS = (5000, 30000)  # server_vad idle_timeout_ms, inclusive

_GA_FORMATS: dict[str, AudioFormat] = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
_GA_FORMAT_NAMES = {v: k for k, v in _GA_FORMATS.items()}


@dataclass(frozen=True, slots=True)
class TurnDetection:
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"

    def vad_settings(self) -> VadSettings:
        if self.type == "semantic_vad":
            return VadSettings(
                threshold=0.5, prefix_padding_ms=300, silence_duration_ms=EAGERNESS_SILENCE_MS[self.eagerness]
            )
        return VadSettings(self.threshold, self.prefix_padding_ms, self.silence_duration_ms)

    def render(self) -> dict[str, Any]:
        common = {
            "type": self.type,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
        }
        if self.type == "semantic_vad":
            return {**common, "eagerness": self.eagerness}
        return {
            **common,
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "idle_timeout_ms": self.idle_timeout_ms,
        }


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


# ---- field parsers shared by session.update and response.create -------------------------------------
def _expect(value: Any, kind: type | tuple[type, ...], param: str, expected: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # JSON true is no number
        raise invalid_type(param, expected, value)
    return value


def _modalities(value: Any, param: str, *, allow_image: bool = False) -> tuple[str, ...]:
    allowed = ("text", "audio", "image") if allow_image else ("text", "audio")
    expected = "'text', 'audio' and/or 'image'" if allow_image else "'text' and/or 'audio'"
    _expect(value, list, param, f"an array of {expected}")
    if not value or any(m not in allowed for m in value):
        raise invalid_value(param, f"a non-empty array of {expected}", value)
    spoken = ("audio",) if "audio" in value else ("text",) if "text" in value else ()
    return spoken + (("image",) if "image" in value else ())


def _beta_format(value: Any, param: str) -> AudioFormat:
    if value not in AUDIO_FORMATS:
        raise invalid_value(param, "one of 'pcm16', 'g711_ulaw', 'g711_alaw'", value)
    return cast(AudioFormat, value)


def _ga_format(value: Any, param: str) -> AudioFormat:
    _expect(value, dict, param, "an object like {'type': 'audio/pcm', 'rate': 24000}")
    kind = value.get("type")
    fmt = _GA_FORMATS.get(kind) if isinstance(kind, str) else None
    if fmt is None:
        raise invalid_value(f"{param}.type", "one of 'audio/pcm', 'audio/pcmu', 'audio/pcma'", value.get("type"))
    rate = value.get("rate", SAMPLE_RATE)
    if fmt == "pcm16" and (type(rate) is not int or rate != SAMPLE_RATE):
        raise invalid_value(f"{param}.rate", "24000", rate)
    return fmt


def render_ga_format(fmt: AudioFormat) -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": SAMPLE_RATE} if fmt == "pcm16" else {"type": _GA_FORMAT_NAMES[fmt]}


def _voice(value: Any, param: str) -> str:
    if isinstance(value, dict):
        return cast(str, _expect(value.get("id"), str, f"{param}.id", "a voice id"))
    return cast(str, _expect(value, str, param, "a voice name"))


def _speed(value: Any, param: str) -> float:
    speed = float(_expect(value, (int, float), param, "a number"))
    if not 0.25 <= speed <= 1.5:
        raise invalid_value(param, "a number between 0.25 and 1.5", value)
    return speed


def _max_tokens(value: Any, param: str) -> int | Literal["inf"]:
    if value == "inf":
        return "inf"
    _expect(value, int, param, "an integer or 'inf'")
    if not 1 <= value <= MAX_OUTPUT_TOKENS_CAP:
        raise invalid_value(param, f"an integer between 1 and {MAX_OUTPUT_TOKENS_CAP}, or 'inf'", value)
    return cast(int, value)


def _tools(value: Any, param: str) -> tuple[dict[str, Any], ...]:
    _expect(value, list, param, "an array of tools")
    for i, tool in enumerate(value):
        _expect(tool, dict, f"{param}[{i}]", "a function tool {'type': 'function', 'name': ...}")
        if tool.get("type", "function") != "function":
            raise invalid_value(f"{param}[{i}].type", "'function'", tool.get("type"))
        if not isinstance(tool.get("name"), str):
            raise invalid_type(f"{param}[{i}].name", "a string", tool.get("name"))
    return tuple(value)


def _tool_choice(value: Any, param: str) -> str | dict[str, Any]:
    if value in ("auto", "none", "required") or (isinstance(value, dict) and isinstance(value.get("name"), str)):
        return cast("str | dict[str, Any]", value)
    raise invalid_value(param, "'auto', 'none', 'required' or {'type': 'function', 'name': ...}", value)


def _temperature(value: Any, param: str) -> float:
    temperature = float(_expect(value, (int, float), param, "a number"))
    if not TEMPERATURE[0] <= temperature <= TEMPERATURE[1]:
        raise invalid_value(param, f"a number between {TEMPERATURE[0]} and {TEMPERATURE[1]}", value)
    return temperature


def _idle_timeout(value: Any, param: str) -> int | None:
    """OpenAI's bounds: a shorter wait would answer silence as fast as the model can reply."""
    if value is None:
        return None
    expected = f"null or an integer between {IDLE_TIMEOUT_MS[0]} and {IDLE_TIMEOUT_MS[1]}"
    if not isinstance(value, int) or isinstance(value, bool) or not IDLE_TIMEOUT_MS[0] <= value <= IDLE_TIMEOUT_MS[1]:
        raise invalid_value(param, expected, value)
    return value


def _turn_detection(value: Any, param: str, current: TurnDetection | None) -> TurnDetection | None:
    if value is None:
        return None
    _expect(value, dict, param, "an object or null")
    kind = value.get("type", current.type if current else "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise invalid_value(f"{param}.type", "'server_vad' or 'semantic_vad'", kind)
    base = current if current is not None and current.type == kind else TurnDetection(type=kind)
    changes: dict[str, Any] = {}
    if "threshold" in value:
        threshold = float(_expect(value["threshold"], (int, float), f"{param}.threshold", "a number"))
        if not 0.0 <= threshold <= 1.0:
            raise invalid_value(f"{param}.threshold", "a number between 0 and 1", value["threshold"])
        changes["threshold"] = threshold
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        if key in value:
            ms = _expect(value[key], int, f"{param}.{key}", "an integer")
            if not 0 <= ms <= MAX_TURN_MS:
                raise invalid_value(f"{param}.{key}", f"an integer between 0 and {MAX_TURN_MS}", ms)
            changes[key] = ms
    for key in ("create_response", "interrupt_response"):
        if key in value:
            changes[key] = _expect(value[key], bool, f"{param}.{key}", "a boolean")
    if "idle_timeout_ms" in value:
        changes["idle_timeout_ms"] = _idle_timeout(value["idle_timeout_ms"], f"{param}.idle_timeout_ms")
    if "eagerness" in value:
        if not isinstance(value["eagerness"], str) or value["eagerness"] not in EAGERNESS_SILENCE_MS:
            raise invalid_value(f"{param}.eagerness", "'low', 'medium', 'high' or 'auto'", value["eagerness"])
        changes["eagerness"] = value["eagerness"]
    return replace(base, **changes)


# ---- session.update -----------------------------------------------------------------------------
def apply_update(current: SessionSettings, update: Any, dialect: Dialect) -> SessionSettings:
    """A partial update merged over ``current``; raises RealtimeError naming the offending field."""
    _expect(update, dict, "session", "an object")
    if "model" in update:
        _expect(update["model"], str, "session.model", "a string")  # the served model is fixed regardless
    if dialect == "ga":
        reject_unknown(update, "session", SU, "ga")
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
        changes["instructions"] = _expect(update["instructions"], str, f"{prefix}.instructions", "a string")
    if "tools" in update:
        changes["tools"] = _tools(update["tools"], f"{prefix}.tools")
    if "tool_choice" in update:
        changes["tool_choice"] = _tool_choice(update["tool_choice"], f"{prefix}.tool_choice")


def _apply_ga(current: SessionSettings, update: dict[str, Any]) -> SessionSettings:
    kind = update.get("type", current.kind)
    if kind not in ("realtime", "transcription"):
        raise invalid_value("session.type", "'realtime' or 'transcription'", kind)
    changes: dict[str, Any] = {"kind": kind}
    _apply_common(update, changes, "session")
    if "output_modalities" in update:
        changes["output_modalities"] = _modalities(update["output_modalities"], "session.output_modalities")
    if "max_output_tokens" in update:
        changes["max_output_tokens"] = _max_tokens(update["max_output_tokens"], "session.max_output_tokens")
    if "truncation" in update:
        parse_truncation(update["truncation"])  # rejects what the prompt fit could not apply
        changes["truncation"] = update["truncation"]
    if "tracing" in update:
        changes["tracing"] = parse_tracing(update["tracing"], "session.tracing")
    if "include" in update:
        changes["include"] = parse_include(update["include"], "session.include")
    if "prompt" in update:
        parse_prompt(update["prompt"], "session.prompt")
    audio = _expect(update.get("audio", {}), dict, "session.audio", "an object")
    audio_in = _expect(audio.get("input", {}), dict, "session.audio.input", "an object")
    audio_out = _expect(audio.get("output", {}), dict, "session.audio.output", "an object")
    if "format" in audio_in:
        changes["input_format"] = _ga_format(audio_in["format"], "session.audio.input.format")
    if "transcription" in audio_in:
        changes["transcription"] = parse_transcription(audio_in["transcription"], "session.audio.input.transcription")
    if "noise_reduction" in audio_in:
        changes["noise_reduction"] = parse_noise_reduction(
            audio_in["noise_reduction"], "session.audio.input.noise_reduction"
        )
    if "turn_detection" in audio_in:
        changes["turn_detection"] = _turn_detection(
            audio_in["turn_detection"], "session.audio.input.turn_detection", current.turn_detection
        )
    if "format" in audio_out:
        changes["output_format"] = _ga_format(audio_out["format"], "session.audio.output.format")
    if "voice" in audio_out:
        changes["voice"] = _voice(audio_out["voice"], "session.audio.output.voice")
    if "speed" in audio_out:
        changes["speed"] = _speed(audio_out["speed"], "session.audio.output.speed")
    return replace(current, **changes)


def apply_transcription_update(current: SessionSettings, update: Any) -> SessionSettings:
    """Beta ``transcription_session.update``: the input side of a session that only transcribes."""
    _expect(update, dict, "session", "an object")
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
        changes["output_modalities"] = _modalities(update["modalities"], "session.modalities")
    if "voice" in update:
        changes["voice"] = _voice(update["voice"], "session.voice")
    if "input_audio_format" in update:
        changes["input_format"] = _beta_format(update["input_audio_format"], "session.input_audio_format")
    if "output_audio_format" in update:
        changes["output_format"] = _beta_format(update["output_audio_format"], "session.output_audio_format")
    if "input_audio_transcription" in update:
        changes["transcription"] = parse_transcription(
            update["input_audio_transcription"], "session.input_audio_transcription"
        )
    if "input_audio_noise_reduction" in update:
        changes["noise_reduction"] = parse_noise_reduction(
            update["input_audio_noise_reduction"], "session.input_audio_noise_reduction"
        )
    if "turn_detection" in update:
        changes["turn_detection"] = _turn_detection(
            update["turn_detection"], "session.turn_detection", current.turn_detection
        )
    if "temperature" in update:
        changes["temperature"] = _temperature(update["temperature"], "session.temperature")
    if "max_response_output_tokens" in update:
        changes["max_output_tokens"] = _max_tokens(
            update["max_response_output_tokens"], "session.max_response_output_tokens"
        )
    if "speed" in update:
        changes["speed"] = _speed(update["speed"], "session.speed")
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
    else:
        _reject_ga_spellings(response, "response", _BETA_RESPONSE_SPELLING)
    _apply_common(response, changes, "response")
    if dialect == "ga":
        if "prompt" in response:
            parse_prompt(response["prompt"], "response.prompt")
        if "output_modalities" in response:
            changes["output_modalities"] = _modalities(
                response["output_modalities"], "response.output_modalities", allow_image=True
            )
        if "max_output_tokens" in response:
            changes["max_output_tokens"] = _max_tokens(response["max_output_tokens"], "response.max_output_tokens")
        audio = _expect(response.get("audio", {}), dict, "response.audio", "an object")
        audio_out = _expect(audio.get("output", {}), dict, "response.audio.output", "an object")
        if "format" in audio_out:
            changes["output_format"] = _ga_format(audio_out["format"], "response.audio.output.format")
        if "voice" in audio_out:
            changes["voice"] = _voice(audio_out["voice"], "response.audio.output.voice")
    else:
        if "modalities" in response:
            changes["output_modalities"] = _modalities(response["modalities"], "response.modalities", allow_image=True)
        if "max_response_output_tokens" in response:
            changes["max_output_tokens"] = _max_tokens(
                response["max_response_output_tokens"], "response.max_response_output_tokens"
            )
        if "voice" in response:
            changes["voice"] = _voice(response["voice"], "response.voice")
        if "output_audio_format" in response:
            changes["output_format"] = _beta_format(response["output_audio_format"], "response.output_audio_format")
        if "temperature" in response:
            changes["temperature"] = _temperature(response["temperature"], "response.temperature")
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
