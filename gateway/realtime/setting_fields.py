"""Parsers of the session fields both ``session.update`` and ``response.create`` read, and turn detection.

Each parser takes the client's value and the ``param`` to name in its error, and returns the canonical value
or raises the ``invalid_type`` / ``invalid_value`` error that names the field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, cast

from omni_gateway.gateway.realtime.audio import AUDIO_FORMATS, SAMPLE_RATE, AudioFormat
from omni_gateway.gateway.realtime.errors import invalid_type, invalid_value
from omni_gateway.gateway.realtime.schema import MAX_OUTPUT_TOKENS_CAP
from omni_gateway.omni.protocol import VadSettings

# semantic_vad's eagerness: how soon a pause that sounds finished ends the turn, and how long one that sounds
# unfinished waits for more (OpenAI documents at most 8 s / 4 s / 2 s; auto is medium). The encoders tune each.
EAGERNESS = ("low", "medium", "high", "auto")
Eagerness = Literal["low", "medium", "high", "auto"]
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
    eagerness: Eagerness = "auto"

    def vad_settings(self) -> VadSettings:
        if self.type == "semantic_vad":
            return VadSettings(threshold=0.5, prefix_padding_ms=300, eagerness=self.eagerness)
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


def expect(value: Any, kind: type | tuple[type, ...], param: str, expected: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # JSON true is no number
        raise invalid_type(param, expected, value)
    return value


def parse_modalities(value: Any, param: str, *, allow_image: bool = False) -> tuple[str, ...]:
    allowed = ("text", "audio", "image") if allow_image else ("text", "audio")
    expected = "'text', 'audio' and/or 'image'" if allow_image else "'text' and/or 'audio'"
    expect(value, list, param, f"an array of {expected}")
    if not value or any(m not in allowed for m in value):
        raise invalid_value(param, f"a non-empty array of {expected}", value)
    spoken = ("audio",) if "audio" in value else ("text",) if "text" in value else ()
    return spoken + (("image",) if "image" in value else ())


def parse_beta_format(value: Any, param: str) -> AudioFormat:
    if value not in AUDIO_FORMATS:
        raise invalid_value(param, "one of 'pcm16', 'g711_ulaw', 'g711_alaw'", value)
    return cast(AudioFormat, value)


def parse_ga_format(value: Any, param: str) -> AudioFormat:
    expect(value, dict, param, "an object like {'type': 'audio/pcm', 'rate': 24000}")
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


def parse_voice(value: Any, param: str) -> str:
    if isinstance(value, dict):
        return cast(str, expect(value.get("id"), str, f"{param}.id", "a voice id"))
    return cast(str, expect(value, str, param, "a voice name"))


def parse_speed(value: Any, param: str) -> float:
    speed = float(expect(value, (int, float), param, "a number"))
    if not 0.25 <= speed <= 1.5:
        raise invalid_value(param, "a number between 0.25 and 1.5", value)
    return speed


def parse_max_tokens(value: Any, param: str) -> int | Literal["inf"]:
    if value == "inf":
        return "inf"
    expect(value, int, param, "an integer or 'inf'")
    if not 1 <= value <= MAX_OUTPUT_TOKENS_CAP:
        raise invalid_value(param, f"an integer between 1 and {MAX_OUTPUT_TOKENS_CAP}, or 'inf'", value)
    return cast(int, value)


def parse_tools(value: Any, param: str) -> tuple[dict[str, Any], ...]:
    expect(value, list, param, "an array of tools")
    for i, tool in enumerate(value):
        expect(tool, dict, f"{param}[{i}]", "a function tool {'type': 'function', 'name': ...}")
        if tool.get("type", "function") != "function":
            raise invalid_value(f"{param}[{i}].type", "'function'", tool.get("type"))
        if not isinstance(tool.get("name"), str):
            raise invalid_type(f"{param}[{i}].name", "a string", tool.get("name"))
    return tuple(value)


def parse_tool_choice(value: Any, param: str) -> str | dict[str, Any]:
    if value in ("auto", "none", "required") or (isinstance(value, dict) and isinstance(value.get("name"), str)):
        return cast("str | dict[str, Any]", value)
    raise invalid_value(param, "'auto', 'none', 'required' or {'type': 'function', 'name': ...}", value)


def parse_temperature(value: Any, param: str) -> float:
    temperature = float(expect(value, (int, float), param, "a number"))
    if not TEMPERATURE[0] <= temperature <= TEMPERATURE[1]:
        raise invalid_value(param, f"a number between {TEMPERATURE[0]} and {TEMPERATURE[1]}", value)
    return temperature


def parse_idle_timeout(value: Any, param: str) -> int | None:
    """OpenAI's bounds: a shorter wait would answer silence as fast as the model can reply."""
    if value is None:
        return None
    expected = f"null or an integer between {IDLE_TIMEOUT_MS[0]} and {IDLE_TIMEOUT_MS[1]}"
    if not isinstance(value, int) or isinstance(value, bool) or not IDLE_TIMEOUT_MS[0] <= value <= IDLE_TIMEOUT_MS[1]:
        raise invalid_value(param, expected, value)
    return value


def parse_turn_detection(value: Any, param: str, current: TurnDetection | None) -> TurnDetection | None:
    if value is None:
        return None
    expect(value, dict, param, "an object or null")
    kind = value.get("type", current.type if current else "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise invalid_value(f"{param}.type", "'server_vad' or 'semantic_vad'", kind)
    base = current if current is not None and current.type == kind else TurnDetection(type=kind)
    changes: dict[str, Any] = {}
    if "threshold" in value:
        threshold = float(expect(value["threshold"], (int, float), f"{param}.threshold", "a number"))
        if not 0.0 <= threshold <= 1.0:
            raise invalid_value(f"{param}.threshold", "a number between 0 and 1", value["threshold"])
        changes["threshold"] = threshold
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        if key in value:
            ms = expect(value[key], int, f"{param}.{key}", "an integer")
            if not 0 <= ms <= MAX_TURN_MS:
                raise invalid_value(f"{param}.{key}", f"an integer between 0 and {MAX_TURN_MS}", ms)
            changes[key] = ms
    for key in ("create_response", "interrupt_response"):
        if key in value:
            changes[key] = expect(value[key], bool, f"{param}.{key}", "a boolean")
    if "idle_timeout_ms" in value:
        changes["idle_timeout_ms"] = parse_idle_timeout(value["idle_timeout_ms"], f"{param}.idle_timeout_ms")
    if "eagerness" in value:
        if not isinstance(value["eagerness"], str) or value["eagerness"] not in EAGERNESS:
            raise invalid_value(f"{param}.eagerness", "'low', 'medium', 'high' or 'auto'", value["eagerness"])
        changes["eagerness"] = value["eagerness"]
    return replace(base, **changes)
