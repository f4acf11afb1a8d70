"""POST /v1/chat/completions: streamed as server-sent events or answered as one JSON body."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from omni_gateway.gateway.http.chat_request import parse_chat
from omni_gateway.gateway.http.chat_response import ChatAssembler
from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import ApiError, internal
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.lora import served_adapters
from omni_gateway.gateway.http.sampling import check_context
from omni_gateway.gateway.http.streaming import (
    SSE_DONE,
    CancellableStream,
    Generation,
    sse_event,
    start,
    unless_disconnected,
)
from omni_gateway.gateway.metrics import TokenTimer, count_tokens
from omni_gateway.omni.protocol import AudioChunk, OmniBackend, OutputChunk, TextDelta
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("omni_gateway.gateway.http")
API = "chat"


async def chat_completions(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    body = await read_json(request, limits.max_body_bytes)
    caps = backend.capabilities
    # off the event loop: base64 and WAV decoding of large media parts take a while
    call = await anyio.to_thread.run_sync(parse_chat, body, caps, limits, served_adapters(backend))
    prompt_tokens = await anyio.to_thread.run_sync(backend.count_tokens, call.request.messages)
    check_context(prompt_tokens, call.request.sampling.max_tokens, caps)
    timer = TokenTimer(API)
    generation, first = await start(request, backend, call.request)
    assembler = ChatAssembler(call, int(time.time()), limits.audio_expires_s)
    if call.stream.stream:
        response: Response = CancellableStream(_events(generation, first, assembler, timer), cleanup=generation.close)
        return response
    try:
        return JSONResponse(await unless_disconnected(request, lambda: _collect(generation, first, assembler, timer)))
    finally:
        await generation.close()
        _record(assembler)


async def _collect(
    generation: Generation, chunk: OutputChunk | None, assembler: ChatAssembler, timer: TokenTimer
) -> dict[str, Any]:
    while chunk is not None:
        _tick(chunk, timer)
        assembler.feed(chunk)
        chunk = await generation.next()
    body: dict[str, Any] = assembler.body()
    return body


async def _events(
    generation: Generation, chunk: OutputChunk | None, assembler: ChatAssembler, timer: TokenTimer
) -> AsyncIterator[bytes]:
    try:
        while chunk is not None:
            _tick(chunk, timer)
            for piece in assembler.feed(chunk):
                yield sse_event(piece)
            chunk = await generation.next()
        usage = assembler.usage_chunk()
        if usage is not None:
            yield sse_event(usage)
        yield SSE_DONE
    except ApiError as error:  # headers are sent: the error travels as an event the SDK raises on
        yield sse_event(error.body())
    except Exception:
        log.exception("chat stream failed")
        yield sse_event(internal().body())
    finally:
        await generation.close()
        _record(assembler)


def _tick(chunk: OutputChunk, timer: TokenTimer) -> None:
    if isinstance(chunk, (TextDelta, AudioChunk)):
        timer.tick()


def _record(assembler: ChatAssembler) -> None:
    if assembler.usage is not None:
        count_tokens(API, assembler.usage.input_tokens, assembler.usage.output_tokens)
