"""POST /v1/messages: Anthropic's Messages API, run as a chat completion, answered in Anthropic's shapes
(message objects, its streamed events, its error envelope)."""

from __future__ import annotations

import logging

import anyio
from omni_gateway.gateway.anthropic_errors import anthropic_error
from omni_gateway.gateway.http.assembled import event_stream, feed_all
from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import ApiError, internal, invalid
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.messages_output import MessageAssembler
from omni_gateway.gateway.http.messages_request import parse_messages_body
from omni_gateway.gateway.http.sampling import check_context
from omni_gateway.gateway.http.streaming import (
    CancellableStream,
    ClientGone,
    sse_event,
    start,
    unless_disconnected,
)
from omni_gateway.gateway.metrics import TokenTimer, count_tokens
from omni_gateway.omni.protocol import InvalidInput, OmniBackend
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("omni_gateway.gateway.http")
API = "messages"


async def create(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    """Every failure answers in Anthropic's envelope, so it is caught here rather than by ``endpoint``."""
    try:
        return await _create(request, backend, limits)
    except ApiError as error:
        return _error_response(error)
    except InvalidInput as error:  # the backend's refusal of the request; its text is client-safe
        return _error_response(invalid(str(error)))
    except ClientGone:
        raise
    except Exception:
        log.exception("unhandled error on /v1/messages")
        return _error_response(internal())


async def _create(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    body = await read_json(request, limits.max_body_bytes)
    caps = backend.capabilities
    call = await anyio.to_thread.run_sync(parse_messages_body, body, caps, limits)
    prompt_tokens = await anyio.to_thread.run_sync(backend.count_tokens, call.chat.request.messages)
    check_context(prompt_tokens, call.chat.request.sampling.max_tokens, caps)
    generation, first = await start(request, backend, call.chat.request)
    assembler = MessageAssembler(call, prompt_tokens)
    timer = TokenTimer(API)
    if call.stream:
        events = event_stream(
            generation,
            first,
            assembler,
            timer,
            api=API,
            error_event=_anthropic_event,
            closed=lambda: _record(assembler),
        )
        return CancellableStream(events, cleanup=generation.close)
    try:
        await unless_disconnected(request, lambda: feed_all(generation, first, assembler, timer))
        return JSONResponse(assembler.body())
    finally:
        await generation.close()
        _record(assembler)


def _error_response(error: ApiError) -> JSONResponse:
    headers = {"retry-after": "1"} if error.status in (429, 503) else None
    return JSONResponse(anthropic_error(error.status, error.message), status_code=error.status, headers=headers)


def _anthropic_event(error: ApiError) -> bytes:
    return sse_event(anthropic_error(error.status, error.message), "error")


def _record(assembler: MessageAssembler) -> None:
    if assembler.usage is not None:
        count_tokens(API, assembler.usage.input_tokens, assembler.usage.output_tokens)
