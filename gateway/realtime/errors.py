"""Client-visible protocol errors: raised inside the session, turned into one ``error`` event each."""

from __future__ import annotations

from typing import Any

from omni_gateway.gateway.client_text import shown

MAX_ECHOED_EVENT_ID = 512  # longer client event ids are not echoed in errors (OpenAI's ids are ~30 characters)


class RealtimeError(Exception):
    """A rejected client event. ``code`` is what clients key on, one of OpenAI's (``invalid_value``,
    ``missing_required_parameter``, ...); ``message`` is for people to read."""

    def __init__(
        self, code: str, message: str, param: str | None = None, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.error_type = error_type

    def body(self, client_event_id: str | None) -> dict[str, Any]:
        if client_event_id is not None and len(client_event_id) > MAX_ECHOED_EVENT_ID:
            client_event_id = None  # an error never echoes a megabyte of hostile input back
        return {
            "type": self.error_type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "event_id": client_event_id,
        }


def invalid_value(param: str, expected: str, got: object) -> RealtimeError:
    return RealtimeError("invalid_value", f"Invalid value for '{param}': expected {expected}, got {shown(got)}.", param)


def invalid_type(param: str, expected: str, got: object) -> RealtimeError:
    return RealtimeError(
        "invalid_type", f"Invalid type for '{param}': expected {expected}, got {type(got).__name__}.", param
    )


def missing(param: str) -> RealtimeError:
    return RealtimeError("missing_required_parameter", f"Missing required parameter: '{param}'.", param)
