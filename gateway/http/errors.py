"""OpenAI's error envelope and the one place where failures become HTTP responses.

Messages are always composed here or in request validation; decoder or backend exception text is never
echoed to the client, since such text can leak memory addresses and internals.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omni_gateway.gateway.errors import client_safe
from omni_gateway.omni.protocol import Error
from starlette.responses import JSONResponse

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class ApiError(Exception):
    """A failure the client should see, with its HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_backend(error: Error) -> ApiError:
    """Map an ``Error`` chunk of the backend's stream onto the HTTP error the client gets."""
    status = error.status if 400 <= error.status <= 599 else 500
    message = client_safe(dataclasses.replace(error, status=status)).message
    return ApiError(status, message, param=error.param, code=error.code)


def internal() -> ApiError:
    return ApiError(500, "The server had an error while processing your request.", code="internal_error")
