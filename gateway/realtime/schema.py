"""The fields of every realtime client event, as data: what the GA dialect accepts, and what a fuzzer enumerates.

Each ``FieldSpec`` names one field by its path (``session.audio.input.format.type``; ``[]`` stands for any
index of an array) with the JSON kinds, bounds and choices its parser accepts. The GA dialect consumes the
table: a key that is not in it for the event (at a level the table marks ``closed``) is refused with
``unknown_parameter`` before anything is parsed, as OpenAI's GA server does. ``tests/gateway`` checks
that every key a parser reads is in the table, so the table cannot fall behind the parsers, and
``benchmarks/fuzz_fields.py`` generates hostile values for each entry.
"""

from __future__ import annotations

from typing import Any

from omni_gateway.gateway.field_spec import BOTH, Dialect, FieldSpec
from omni_gateway.gateway.realtime.errors import RealtimeError

SU, TSU, RC = "session.update", "transcription_session.update", "response.create"
IC, IA = "conversation.item.create", "input_audio_buffer.append"
IT, IR, ID, CANCEL = (
    "conversation.item.truncate",
    "conversation.item.retrieve",
    "conversation.item.delete",
    "response.cancel",
)
COMMIT, CLEAR = "input_audio_buffer.commit", "input_audio_buffer.clear"
EVENTS = (SU, TSU, RC, IC, IA, IT, IR, ID, CANCEL, COMMIT, CLEAR)
GA: tuple[Dialect, ...] = ("ga",)
BETA: tuple[Dialect, ...] = ("beta",)

# GA names of fields the beta dialect spells otherwise: refused there whatever their value (see settings).
GA_SPELLINGS = ("output_modalities", "max_output_tokens", "audio")
INCLUDE_CHOICES = ("item.input_audio_transcription.logprobs",)
MAX_OUTPUT_TOKENS_CAP = 4096


def _turn_detection(prefix: str, events: tuple[str, ...], dialects: tuple[Dialect, ...]) -> list[FieldSpec]:
    p = f"{prefix}.turn_detection"
    return [
        FieldSpec(p, ("object",), events, dialects, nullable=True, closed=True),
        FieldSpec(f"{p}.type", ("string",), events, dialects, choices=("server_vad", "semantic_vad")),
        FieldSpec(f"{p}.threshold", ("number",), events, dialects, lo=0.0, hi=1.0),
        FieldSpec(f"{p}.prefix_padding_ms", ("integer",), events, dialects, lo=0, hi=10_000),
        FieldSpec(f"{p}.silence_duration_ms", ("integer",), events, dialects, lo=0, hi=10_000),
        FieldSpec(f"{p}.create_response", ("boolean",), events, dialects),
        FieldSpec(f"{p}.interrupt_response", ("boolean",), events, dialects),
        FieldSpec(f"{p}.idle_timeout_ms", ("integer",), events, dialects, nullable=True, lo=5000, hi=30000),
        FieldSpec(f"{p}.eagerness", ("string",), events, dialects, choices=("low", "medium", "high", "auto")),
    ]


def _transcription(path: str, events: tuple[str, ...], dialects: tuple[Dialect, ...]) -> list[FieldSpec]:
    return [
        FieldSpec(path, ("object",), events, dialects, nullable=True, closed=True),
        *(
            FieldSpec(f"{path}.{k}", ("string",), events, dialects, nullable=True)
            for k in ("model", "language", "prompt")
        ),
    ]


def _noise_reduction(path: str, events: tuple[str, ...], dialects: tuple[Dialect, ...]) -> list[FieldSpec]:
    return [
        FieldSpec(path, ("object",), events, dialects, nullable=True, closed=True),
        FieldSpec(f"{path}.type", ("string",), events, dialects, choices=("near_field", "far_field")),
    ]


def _ga_format(path: str, events: tuple[str, ...]) -> list[FieldSpec]:
    return [
        FieldSpec(path, ("object",), events, GA, closed=True, required=("type",)),
        FieldSpec(f"{path}.type", ("string",), events, GA, choices=("audio/pcm", "audio/pcmu", "audio/pcma")),
        FieldSpec(f"{path}.rate", ("integer",), events, GA, lo=24000, hi=24000),
    ]


def _voice(path: str, events: tuple[str, ...], dialects: tuple[Dialect, ...]) -> list[FieldSpec]:
    """A name or ``{"id": name}``; the name must be one of the backend's voices, which the table cannot list."""
    return [
        FieldSpec(path, ("string", "object"), events, dialects, closed=True, exact=False),
        FieldSpec(f"{path}.id", ("string",), events, dialects, exact=False),
    ]


def _tracing(path: str, events: tuple[str, ...], dialects: tuple[Dialect, ...]) -> list[FieldSpec]:
    return [
        FieldSpec(path, ("string", "object"), events, dialects, nullable=True, choices=("auto",), closed=True),
        FieldSpec(f"{path}.workflow_name", ("string",), events, dialects),
        FieldSpec(f"{path}.group_id", ("string",), events, dialects),
        FieldSpec(f"{path}.metadata", ("object",), events, dialects),
    ]


def _prompt(path: str, events: tuple[str, ...]) -> list[FieldSpec]:
    """Reusable prompts live on OpenAI's servers; this one has none, so only null passes (see settings)."""
    return [
        FieldSpec(path, ("object",), events, GA, nullable=True, closed=True, required=("id",), exact=False),
        FieldSpec(f"{path}.id", ("string",), events, GA, exact=False),
        FieldSpec(f"{path}.version", ("string",), events, GA, exact=False),
        FieldSpec(f"{path}.variables", ("object",), events, GA, exact=False),
    ]


def _reasoning(prefix: str, events: tuple[str, ...]) -> list[FieldSpec]:
    """For reasoning models only (OpenAI's own rule); none is served here, so only what it does anyway passes."""
    return [
        FieldSpec(f"{prefix}.parallel_tool_calls", ("boolean",), events, GA, exact=False),
        FieldSpec(f"{prefix}.reasoning", ("object",), events, GA, nullable=True, exact=False),
        FieldSpec(f"{prefix}.reasoning.effort", ("string",), events, GA, exact=False),
    ]


def _image(path: str) -> list[FieldSpec]:
    """``response.image``: options of image output, an extension (see the README)."""
    return [
        FieldSpec(path, ("object",), (RC,), BOTH, nullable=True, closed=True),
        FieldSpec(f"{path}.size", ("string",), (RC,), BOTH, nullable=True, exact=False),
        FieldSpec(f"{path}.partial_images", ("integer",), (RC,), BOTH, nullable=True, lo=0, hi=3),
        FieldSpec(f"{path}.num_inference_steps", ("integer",), (RC,), BOTH, nullable=True, lo=1, hi=200),
        FieldSpec(f"{path}.seed", ("integer",), (RC,), BOTH, nullable=True, lo=0, hi=2**63 - 1),
    ]


def _common(prefix: str, events: tuple[str, ...]) -> list[FieldSpec]:
    """Fields both dialects share under ``prefix`` (``session`` or ``response``)."""
    return [
        FieldSpec(f"{prefix}.instructions", ("string",), events),
        FieldSpec(f"{prefix}.tools", ("array",), events, exact=False),
        FieldSpec(f"{prefix}.tools[].type", ("string",), events, choices=("function",)),
        FieldSpec(f"{prefix}.tools[].name", ("string",), events),
        FieldSpec(f"{prefix}.tool_choice", ("string", "object"), events, exact=False),
        FieldSpec(f"{prefix}.tool_choice.name", ("string",), events, exact=False),
    ]


def _max_tokens(path: str, events: tuple[str, ...], dialects: tuple[Dialect, ...]) -> FieldSpec:
    return FieldSpec(path, ("integer", "string"), events, dialects, lo=1, hi=MAX_OUTPUT_TOKENS_CAP, choices=("inf",))


def _build() -> tuple[FieldSpec, ...]:
    every = EVENTS
    specs: list[FieldSpec] = [
        FieldSpec("type", ("string",), every, exact=False),
        FieldSpec("event_id", ("any",), every, exact=False),
        # ---- session.update ----
        FieldSpec("session", ("object",), (SU,), GA, closed=True),
        FieldSpec("session", ("object",), (SU, TSU), BETA),
        FieldSpec("session.type", ("string",), (SU,), GA, choices=("realtime", "transcription")),
        FieldSpec("session.model", ("string",), (SU,)),
        # Read-only fields of session.created: a client may send back what it received.
        FieldSpec("session.id", ("any",), (SU,), GA, exact=False),
        FieldSpec("session.object", ("any",), (SU,), GA, exact=False),
        FieldSpec("session.expires_at", ("any",), (SU,), GA, exact=False),
        *_common("session", (SU,)),
        FieldSpec("session.output_modalities", ("array",), (SU,), GA, items=("text", "audio"), min_items=1),
        _max_tokens("session.max_output_tokens", (SU,), GA),
        FieldSpec("session.truncation", ("string", "object"), (SU,), GA, choices=("auto", "disabled"), exact=False),
        FieldSpec("session.truncation.type", ("string",), (SU,), GA, exact=False),
        FieldSpec("session.truncation.retention_ratio", ("number",), (SU,), GA, exact=False),
        *_tracing("session.tracing", (SU,), BOTH),
        *_prompt("session.prompt", (SU,)),
        *_reasoning("session", (SU,)),
        FieldSpec("session.include", ("array",), (SU, TSU), nullable=True, items=INCLUDE_CHOICES),
        FieldSpec("session.audio", ("object",), (SU,), GA, closed=True),
        FieldSpec("session.audio.input", ("object",), (SU,), GA, closed=True),
        *_ga_format("session.audio.input.format", (SU,)),
        *_transcription("session.audio.input.transcription", (SU,), GA),
        *_noise_reduction("session.audio.input.noise_reduction", (SU,), GA),
        *_turn_detection("session.audio.input", (SU,), GA),
        FieldSpec("session.audio.output", ("object",), (SU,), GA, closed=True),
        *_ga_format("session.audio.output.format", (SU,)),
        *_voice("session.audio.output.voice", (SU,), GA),
        FieldSpec("session.audio.output.speed", ("number",), (SU,), GA, lo=0.25, hi=1.5),
        # beta names
        FieldSpec("session.modalities", ("array",), (SU,), BETA, items=("text", "audio"), min_items=1),
        *(FieldSpec(f"session.{k}", (), (SU,), BETA) for k in GA_SPELLINGS),
        *_voice("session.voice", (SU,), BETA),
        FieldSpec(
            "session.input_audio_format", ("string",), (SU, TSU), BETA, choices=("pcm16", "g711_ulaw", "g711_alaw")
        ),
        FieldSpec("session.output_audio_format", ("string",), (SU,), BETA, choices=("pcm16", "g711_ulaw", "g711_alaw")),
        *_transcription("session.input_audio_transcription", (SU, TSU), BETA),
        *_noise_reduction("session.input_audio_noise_reduction", (SU, TSU), BETA),
        *_turn_detection("session", (SU, TSU), BETA),
        FieldSpec("session.temperature", ("number",), (SU,), BETA, lo=0.6, hi=1.2),
        _max_tokens("session.max_response_output_tokens", (SU,), BETA),
        FieldSpec("session.speed", ("number",), (SU,), BETA, lo=0.25, hi=1.5),
        # ---- response.create ----
        FieldSpec("response", ("object",), (RC,), GA, nullable=True, closed=True),
        FieldSpec("response", ("object",), (RC,), BETA, nullable=True),
        FieldSpec("response.conversation", ("string",), (RC,), choices=("auto", "none")),
        FieldSpec("response.metadata", ("object",), (RC,), nullable=True, exact=False),
        FieldSpec("response.input", ("array",), (RC,), nullable=True, exact=False),
        FieldSpec("response.input[].type", ("string",), (RC,), exact=False),
        FieldSpec("response.input[].id", ("string",), (RC,), exact=False),
        *_common("response", (RC,)),
        *_image("response.image"),
        FieldSpec("response.output_modalities", ("array",), (RC,), GA, items=("text", "audio"), min_items=1),
        _max_tokens("response.max_output_tokens", (RC,), GA),
        FieldSpec("response.audio", ("object",), (RC,), GA, closed=True),
        FieldSpec("response.audio.output", ("object",), (RC,), GA, closed=True),
        *_ga_format("response.audio.output.format", (RC,)),
        *_voice("response.audio.output.voice", (RC,), GA),
        *_prompt("response.prompt", (RC,)),
        *_reasoning("response", (RC,)),
        FieldSpec("response.modalities", ("array",), (RC,), BETA, items=("text", "audio"), min_items=1),
        *(FieldSpec(f"response.{k}", (), (RC,), BETA) for k in GA_SPELLINGS),
        _max_tokens("response.max_response_output_tokens", (RC,), BETA),
        *_voice("response.voice", (RC,), BETA),
        FieldSpec(
            "response.output_audio_format", ("string",), (RC,), BETA, choices=("pcm16", "g711_ulaw", "g711_alaw")
        ),
        FieldSpec("response.temperature", ("number",), (RC,), BETA, lo=0.6, hi=1.2),
        # ---- conversation items ----
        FieldSpec("previous_item_id", ("string",), (IC,), nullable=True, exact=False),
        FieldSpec("item", ("object",), (IC,), exact=False),
        FieldSpec("item.id", ("string",), (IC,), nullable=True, exact=False),
        FieldSpec("item.type", ("string",), (IC,), exact=False),
        FieldSpec("item.role", ("string",), (IC,), choices=("user", "assistant", "system")),
        FieldSpec("item.content", ("array",), (IC,), exact=False),
        FieldSpec("item.content[].type", ("string",), (IC,), exact=False),
        FieldSpec("item.content[].text", ("string",), (IC,)),
        FieldSpec("item.content[].transcript", ("string",), (IC,), nullable=True),
        FieldSpec("item.content[].audio", ("string",), (IC,), nullable=True, exact=False),
        FieldSpec("item.content[].image_url", ("string",), (IC,), exact=False),
        FieldSpec("item.content[].detail", ("string",), (IC,), choices=("auto", "low", "high")),
        FieldSpec("item.call_id", ("string",), (IC,), exact=False),
        FieldSpec("item.name", ("string",), (IC,)),
        FieldSpec("item.arguments", ("string",), (IC,), nullable=True),
        FieldSpec("item.output", ("string",), (IC,)),
        # ---- the rest ----
        FieldSpec("audio", ("string",), (IA,), exact=False),
        FieldSpec("item_id", ("string",), (IT, IR, ID), exact=False),
        FieldSpec("content_index", ("integer",), (IT,), exact=False),
        FieldSpec("audio_end_ms", ("integer",), (IT,), exact=False),
        FieldSpec("response_id", ("string",), (CANCEL,), nullable=True, exact=False),
    ]
    return tuple(specs)


FIELDS: tuple[FieldSpec, ...] = _build()
_INDEX: dict[tuple[str, Dialect, str], FieldSpec] = {
    (event, dialect, spec.path): spec for spec in FIELDS for event in spec.events for dialect in spec.dialects
}


def field_spec(event: str, dialect: Dialect, path: str) -> FieldSpec | None:
    return _INDEX.get((event, dialect, path))


def unknown_parameter(param: str) -> RealtimeError:
    return RealtimeError("unknown_parameter", f"Unknown parameter: '{param}'.", param)


def reject_unknown(value: Any, path: str, event: str, dialect: Dialect) -> None:
    """Raise ``unknown_parameter`` for the first key under ``path`` that the table lacks, descending into
    every ``closed`` object. Values are not checked here: the parsers do that, with their own messages."""
    spec = field_spec(event, dialect, path)
    if spec is None or not spec.closed or not isinstance(value, dict):
        return
    for key, child in value.items():
        child_path = f"{path}.{key}"
        if "." in key or "[" in key or field_spec(event, dialect, child_path) is None:
            raise unknown_parameter(f"{path}.{key[:64]}..." if len(key) > 64 else child_path)
        reject_unknown(child, child_path, event, dialect)
