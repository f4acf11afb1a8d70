"""Anthropic's error envelope, ``{"type": "error", "error": {"type": ..., "message": ...}}``: what /v1/messages
answers with, from the route itself and from the admission guard in front of it. Stdlib only."""

from __future__ import annotations

from typing import Any

MESSAGES_PATH = "/v1/messages"

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
