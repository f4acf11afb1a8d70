"""Output constraints of a request body: OpenAI's ``response_format`` (chat only) and vLLM's
``structured_outputs`` field, with vLLM's older ``guided_*`` fields. Pure.

Only the shape is checked here; whether xgrammar can compile a schema, regex or grammar is the
backend's to say (its refusal names the field through ``OutputConstraint.param``).
"""

from __future__ import annotations

import json
from typing import Any

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.errors import invalid
from omni_gateway.gateway.http.fields import get_bool, get_str, require_object
from omni_gateway.omni.protocol import ConstraintKind, OutputConstraint

_MAX_SPEC_CHARS = 200_000
_MAX_CHOICES = 1024
_STRUCTURED_KEYS: dict[str, ConstraintKind] = {
    "json": "json",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "json_object": "json_object",
}
_GUIDED_KEYS: dict[str, ConstraintKind] = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def parse_constraint(body: dict[str, Any], *, response_format: bool) -> OutputConstraint | None:
    """The one constraint the body asks for, or None; ``response_format`` only where the API has it."""
    found: list[OutputConstraint] = []
    if response_format:
        fmt = _response_format(body)
        if fmt is not None:
            found.append(fmt)
    elif "response_format" in body:
        raise invalid("'response_format' is not supported on this endpoint.", "response_format")
    value = body.get("structured_outputs")
    if value is not None:
        options = require_object(value, "structured_outputs")
        given = [key for key in options if options[key] is not None and options[key] is not False]
        unknown = [key for key in given if key not in _STRUCTURED_KEYS]
        if unknown:
            raise invalid(
                f"'structured_outputs.{unknown[0]}' is not supported; use one of {', '.join(_STRUCTURED_KEYS)}.",
                f"structured_outputs.{unknown[0]}",
                "unsupported_parameter",
            )
        if len(given) != 1:
            raise invalid(
                f"'structured_outputs' takes exactly one of {', '.join(_STRUCTURED_KEYS)}; got {len(given)}.",
                "structured_outputs",
            )
        key = given[0]
        found.append(_constraint(_STRUCTURED_KEYS[key], options[key], f"structured_outputs.{key}"))
    for key, kind in _GUIDED_KEYS.items():
        if body.get(key) is not None:
            found.append(_constraint(kind, body[key], key))
    if len(found) > 1:
        names = ", ".join(f"'{c.param.split('.')[0]}'" for c in found)
        raise invalid(f"Send one output constraint, got {names}.", found[1].param)
    return found[0] if found else None


def _response_format(body: dict[str, Any]) -> OutputConstraint | None:
    value = body.get("response_format")
    if value is None:
        return None
    fmt = require_object(value, "response_format")
    kind = get_str(fmt, "type", required=True, param="response_format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object", param="response_format")
    if kind != "json_schema":
        raise invalid(
            f'\'response_format.type\' must be "text", "json_object" or "json_schema", got {shown(kind)}.',
            "response_format.type",
        )
    spec = require_object(fmt.get("json_schema"), "response_format.json_schema")
    get_str(spec, "name", required=True, max_len=64, param="response_format.json_schema.name")
    get_bool(spec, "strict", param="response_format.json_schema.strict")  # always enforced: decoding follows it
    schema = spec.get("schema", {})
    return _constraint("json", schema, "response_format.json_schema.schema")


def _constraint(kind: ConstraintKind, value: Any, param: str) -> OutputConstraint:
    if kind == "json_object":
        if value is not True:
            raise invalid(f"'{param}' must be true.", param)
        return OutputConstraint("json_object", param=param)
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise invalid(f"'{param}' is not valid JSON: {exc}.", param) from None
        if not isinstance(value, (dict, bool)):
            raise invalid(f"'{param}' must be a JSON schema (an object), got {type(value).__name__}.", param)
        text = json.dumps(value, ensure_ascii=False)  # key order matters: properties follow it
        _check_size(text, param)
        return OutputConstraint("json", text, param=param)
    if kind == "choice":
        if (
            not isinstance(value, list)
            or not value
            or len(value) > _MAX_CHOICES
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise invalid(
                f"'{param}' must be an array of 1 to {_MAX_CHOICES} non-empty strings, got {shown(value)}.", param
            )
        _check_size("".join(value), param)
        return OutputConstraint("choice", choices=tuple(value), param=param)
    if not isinstance(value, str) or not value:
        raise invalid(f"'{param}' must be a non-empty string, got {shown(value)}.", param)
    _check_size(value, param)
    return OutputConstraint(kind, value, param=param)


def _check_size(text: str, param: str) -> None:
    if len(text) > _MAX_SPEC_CHARS:
        raise invalid(f"'{param}' has {len(text)} characters; at most {_MAX_SPEC_CHARS} are accepted.", param)
