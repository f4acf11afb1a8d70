"""What every HTTP route shares: bounded body reading, error envelope, request metrics (the guard admits)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from omni_gateway.gateway.client_text import invalid_text_message, invalid_text_path
from omni_gateway.gateway.http.errors import ApiError, internal, invalid
from omni_gateway.gateway.http.streaming import ClientGone
from omni_gateway.gateway.metrics import HTTP_REQUESTS
from omni_gateway.omni.protocol import InvalidInput
from starlette.requests import Request
from starlette.responses import Response

log = logging.getLogger("omni_gateway.gateway.http")
Handler = Callable[[Request], Awaitable[Response]]
CLIENT_CLOSED = 499  # nginx's convention; the client never reads it, metrics do


def endpoint(route: str, handler: Handler) -> Handler:
    async def run(request: Request) -> Response:
        try:
            response = await handler(request)
        except ApiError as error:
            response = error.response()
        except InvalidInput as error:  # the one backend exception that is the client's fault; its text is safe to show
            response = invalid(str(error), code=error.code).response()
        except ClientGone:
            response = Response(status_code=CLIENT_CLOSED)
        except Exception:
            log.exception("unhandled error on %s", route)
            response = internal().response()
        HTTP_REQUESTS.labels(route, str(response.status_code)).inc()
        return response

    return run


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


async def read_json(request: Request, limit: int) -> object:
    raw = await read_body(request, limit)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise invalid("The request body is not valid JSON.", code="invalid_json") from None
    bad = invalid_text_path(body)
    if bad is not None:
        raise invalid(invalid_text_message(bad), param=bad or None, code="invalid_value")
    return body


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"The request body exceeds the limit of {limit} bytes.", code="request_too_large")
