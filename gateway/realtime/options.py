"""Session options that are stored and echoed rather than acted on: each checked against OpenAI's shape, so
``session.updated`` never echoes something the client did not mean, and each raising one error that names
the offending field."""

from __future__ import annotations

from typing import Any

from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_type, invalid_value, missing
from omni_gateway.gateway.realtime.schema import INCLUDE_CHOICES

TRANSCRIPTION_KEYS = ("model", "language", "prompt")
NOISE_REDUCTION_TYPES = ("near_field", "far_field")


def parse_include(value: Any, param: str) -> list[str] | None:
    """``include``: null or a list of the extra outputs to report; only transcription logprobs exist."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid_type(param, f"null or an array of {INCLUDE_CHOICES[0]!r}", value)
    for i, entry in enumerate(value):
        if entry not in INCLUDE_CHOICES:
            raise invalid_value(f"{param}[{i}]", " or ".join(repr(c) for c in INCLUDE_CHOICES), entry)
    return list(dict.fromkeys(value))


def parse_tracing(value: Any, param: str) -> str | dict[str, Any] | None:
    """``tracing``: null, "auto", or {workflow_name, group_id, metadata}; kept for the echo only."""
    if value is None or value == "auto":
        return value  # type: ignore[no-any-return]
    if not isinstance(value, dict):
        raise invalid_value(param, "null, 'auto' or an object {workflow_name, group_id, metadata}", value)
    for key in ("workflow_name", "group_id"):
        if key in value and not isinstance(value[key], str):
            raise invalid_type(f"{param}.{key}", "a string", value[key])
    if "metadata" in value and not isinstance(value["metadata"], dict):
        raise invalid_type(f"{param}.metadata", "an object", value["metadata"])
    return {k: value[k] for k in ("workflow_name", "group_id", "metadata") if k in value}


def parse_prompt(value: Any, param: str) -> None:
    """``prompt``: a reusable prompt stored on OpenAI's servers. This server has no prompt store, so a
    prompt is refused rather than echoed without effect; null (no prompt) passes."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid_type(param, "null or an object {id, version, variables}", value)
    if "id" not in value:
        raise missing(f"{param}.id")
    if not isinstance(value["id"], str):
        raise invalid_type(f"{param}.id", "a string", value["id"])
    if "version" in value and not isinstance(value["version"], str):
        raise invalid_type(f"{param}.version", "a string", value["version"])
    if "variables" in value and not isinstance(value["variables"], dict):
        raise invalid_type(f"{param}.variables", "an object", value["variables"])
    raise RealtimeError(
        "unsupported_parameter",
        f"'{param}' is not supported: this server has no reusable prompts; send 'instructions' instead.",
        param,
    )


def refuse_reasoning_options(update: dict[str, Any], prefix: str) -> None:
    """``parallel_tool_calls`` and ``reasoning``: OpenAI takes them for reasoning models only, and no model
    served here reasons. What the server does anyway (no parallel calls, no reasoning) passes."""
    if update.get("parallel_tool_calls", False) is not False:
        param = f"{prefix}.parallel_tool_calls"
        if not isinstance(update["parallel_tool_calls"], bool):
            raise invalid_type(param, "a boolean", update["parallel_tool_calls"])
        raise RealtimeError(
            "unsupported_parameter", f"'{param}' is not supported: the served model does not reason.", param
        )
    if update.get("reasoning") is not None:
        param = f"{prefix}.reasoning"
        raise RealtimeError(
            "unsupported_parameter", f"'{param}' is not supported: the served model does not reason.", param
        )


def parse_transcription(value: Any, param: str) -> dict[str, Any] | None:
    """Input transcription settings: null turns it off; ``language`` and ``prompt`` reach the recogniser."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_type(param, "an object or null", value)
    for key in TRANSCRIPTION_KEYS:
        if value.get(key) is not None and not isinstance(value[key], str):
            raise invalid_type(f"{param}.{key}", "a string", value[key])
    return dict(value)


def parse_noise_reduction(value: Any, param: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_type(param, "an object or null", value)
    if "type" in value and value["type"] not in NOISE_REDUCTION_TYPES:
        raise invalid_value(f"{param}.type", "'near_field' or 'far_field'", value["type"])
    return dict(value)
