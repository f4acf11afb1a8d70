"""POST /v1/messages: Anthropic's Messages API, run as a chat completion, answered in Anthropic's shapes
(message objects, its streamed events, its error envelope)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from omni_gateway.gateway.anthropic_errors import anthropic_error
from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import ApiError, internal, invalid
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.messages_output import MessageAssembler
from omni_gateway.gateway.http.messages_request import parse_messages_body
from omni_gateway.gateway.http.sampling import check_context
from omni_gateway.gateway.http.streaming import (
    CancellableStream,
    ClientGone,
    Generation,
    sse_event,
    start,
    unless_disconnected,
)
from omni_gateway.gateway.metrics import TokenTimer, count_tokens
from omni_gateway.omni.protocol import InvalidInput, OmniBackend, OutputChunk, TextDelta
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
        return CancellableStream(_events(generation, first, assembler, timer), cleanup=generation.close)
    try:
        return JSONResponse(await unless_disconnected(request, lambda: _collect(generation, first, assembler, timer)))
    finally:
        await generation.close()
        _record(assembler)


def _error_response(error: ApiError) -> JSONResponse:
    headers = {"retry-after": "1"} if error.status in (429, 503) else None
    return JSONResponse(anthropic_error(error.status, error.message), status_code=error.status, headers=headers)


async def _collect(
    generation: Generation, chunk: OutputChunk | None, assembler: MessageAssembler, timer: TokenTimer
) -> dict[str, Any]:
    while chunk is not None:
        _tick(chunk, timer)
        assembler.feed(chunk)
        chunk = await generation.next()
    return assembler.body()


async def _events(
    generation: Generation, chunk: OutputChunk | None, assembler: MessageAssembler, timer: TokenTimer
) -> AsyncIterator[bytes]:
    try:
        for event in assembler.start():
            yield sse_event(event, event["type"])
        while chunk is not None:
            _tick(chunk, timer)
            for event in assembler.feed(chunk):
                yield sse_event(event, event["type"])
            chunk = await generation.next()
        for event in assembler.finish():
            yield sse_event(event, event["type"])
    except ApiError as error:  # headers are sent: the error travels as Anthropic's "error" event
        yield sse_event(anthropic_error(error.status, error.message), "error")
    except Exception:
        log.exception("messages stream failed")
        failure = internal()
        yield sse_event(anthropic_error(failure.status, failure.message), "error")
    finally:
        await generation.close()
        _record(assembler)


def _tick(chunk: OutputChunk, timer: TokenTimer) -> None:
    if isinstance(chunk, TextDelta):
        timer.tick()


def _record(assembler: MessageAssembler) -> None:
    if assembler.usage is not None:
        count_tokens(API, assembler.usage.input_tokens, assembler.usage.output_tokens)
