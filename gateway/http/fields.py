"""Typed access to fields of a decoded JSON body, raising OpenAI-style 400s that name the field.

Pure functions: no I/O, so request parsing is unit-tested without a server.
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.errors import invalid


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def require_object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"'{param}' must be a JSON object, got {_type_name(value)}.", param)
    return value


@overload
def get_str(
    body: dict[str, Any],
    key: str,
    default: str,
    *,
    required: bool = ...,
    choices: tuple[str, ...] = ...,
    max_len: int | None = ...,
    param: str | None = ...,
) -> str: ...
@overload
def get_str(
    body: dict[str, Any],
    key: str,
    default: None = ...,
    *,
    required: Literal[True],
    choices: tuple[str, ...] = ...,
    max_len: int | None = ...,
    param: str | None = ...,
) -> str: ...
@overload
def get_str(
    body: dict[str, Any],
    key: str,
    default: None = ...,
    *,
    required: bool = ...,
    choices: tuple[str, ...] = ...,
    max_len: int | None = ...,
    param: str | None = ...,
) -> str | None: ...
def get_str(
    body: dict[str, Any],
    key: str,
    default: str | None = None,
    *,
    required: bool = False,
    choices: tuple[str, ...] = (),
    max_len: int | None = None,
    param: str | None = None,
) -> str | None:
    param = param or key
    value = body.get(key)
    if value is None:
        if required:
            raise invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
        return default
    if not isinstance(value, str):
        raise invalid(f"'{param}' must be a string, got {_type_name(value)}.", param)
    if choices and value not in choices:
        raise invalid(f"'{param}' must be one of {', '.join(repr(c) for c in choices)}, got {shown(value)}.", param)
    if max_len is not None and len(value) > max_len:
        raise invalid(
            f"'{param}' is {len(value)} characters long; at most {max_len} are accepted.",
            param,
            "string_above_max_length",
        )
    return value


def get_bool(body: dict[str, Any], key: str, default: bool = False, *, param: str | None = None) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{param or key}' must be a boolean, got {_type_name(value)}.", param or key)
    return value


@overload
def get_int(
    body: dict[str, Any], key: str, default: int, *, lo: int | None = ..., hi: int | None = ..., param: str | None = ...
) -> int: ...
@overload
def get_int(
    body: dict[str, Any],
    key: str,
    default: None = ...,
    *,
    lo: int | None = ...,
    hi: int | None = ...,
    param: str | None = ...,
) -> int | None: ...
def get_int(
    body: dict[str, Any],
    key: str,
    default: int | None = None,
    *,
    lo: int | None = None,
    hi: int | None = None,
    param: str | None = None,
) -> int | None:
    param = param or key
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{param}' must be an integer, got {_type_name(value)}.", param)
    _check_range(value, lo, hi, param)
    return value


@overload
def get_float(
    body: dict[str, Any],
    key: str,
    default: float,
    *,
    lo: float | None = ...,
    hi: float | None = ...,
    param: str | None = ...,
) -> float: ...
@overload
def get_float(
    body: dict[str, Any],
    key: str,
    default: None = ...,
    *,
    lo: float | None = ...,
    hi: float | None = ...,
    param: str | None = ...,
) -> float | None: ...
def get_float(
    body: dict[str, Any],
    key: str,
    default: float | None = None,
    *,
    lo: float | None = None,
    hi: float | None = None,
    param: str | None = None,
) -> float | None:
    param = param or key
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"'{param}' must be a finite number, got {shown(value)}.", param)
    _check_range(value, lo, hi, param)
    return float(value)


def _check_range(value: float, lo: float | None, hi: float | None, param: str) -> None:
    if lo is not None and value < lo:
        raise invalid(f"{shown(value)} is less than the minimum of {lo} - '{param}'.", param, "below_minimum")
    if hi is not None and value > hi:
        raise invalid(f"{shown(value)} is greater than the maximum of {hi} - '{param}'.", param, "above_maximum")


def get_stop(body: dict[str, Any], *, max_items: int, max_len: int) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid("'stop' must be a string or a list of strings.", "stop")
    if len(items) > max_items:
        raise invalid(f"'stop' has {len(items)} sequences; at most {max_items} are accepted.", "stop")
    for s in items:
        if not s:
            raise invalid("'stop' sequences must not be empty.", "stop")
        if len(s) > max_len:
            raise invalid(f"a 'stop' sequence is {len(s)} characters long; at most {max_len} are accepted.", "stop")
    return tuple(items)
