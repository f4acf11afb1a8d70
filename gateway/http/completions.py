"""POST /v1/completions: raw prompts without a chat template; several prompts run one after another."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from omni_gateway.gateway.http.completion_request import CompletionCall, parse_completion
from omni_gateway.gateway.http.completion_response import CompletionAssembler
from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import ApiError, from_backend, internal
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
from omni_gateway.omni.protocol import Error, OmniBackend, OutputChunk, TextDelta
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("omni_gateway.gateway.http")
API = "completions"


class _Run:
    """The prompts of one call, generated in turn; ``close`` ends whichever generation is open."""

    def __init__(self, backend: OmniBackend, call: CompletionCall, assembler: CompletionAssembler) -> None:
        self.backend = backend
        self.call = call
        self.assembler = assembler
        self.timer = TokenTimer(API)
        self.current: Generation | None = None

    async def chunks(self, first: tuple[Generation, OutputChunk | None]) -> AsyncIterator[dict[str, Any]]:
        for index, request in enumerate(self.call.requests):
            if index == 0:
                self.current, chunk = first
            else:
                self.current = Generation(self.backend, request)
                chunk = await self.current.next()
            while chunk is not None:
                if isinstance(chunk, Error):
                    raise from_backend(chunk)
                if isinstance(chunk, TextDelta):
                    self.timer.tick()
                for piece in self.assembler.feed(index, chunk):
                    yield piece
                chunk = await self.current.next()
            await self.current.close()

    async def close(self) -> None:
        if self.current is not None:
            await self.current.close()
        count_tokens(API, self.assembler.usage.input_tokens, self.assembler.usage.output_tokens)


async def completions(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    body = await read_json(request, limits.max_body_bytes)
    caps = backend.capabilities
    call = parse_completion(body, caps, limits, served_adapters(backend))
    for omni_request in call.requests:
        tokens = await anyio.to_thread.run_sync(backend.count_tokens, omni_request.messages)
        check_context(tokens, omni_request.sampling.max_tokens, caps)
    run = _Run(backend, call, CompletionAssembler(call, int(time.time())))
    first = await start(request, backend, call.requests[0])
    if call.stream.stream:
        response: Response = CancellableStream(_events(run, first), cleanup=run.close)
        return response

    async def collect() -> dict[str, Any]:
        async for _ in run.chunks(first):
            pass
        result: dict[str, Any] = run.assembler.body()
        return result

    try:
        return JSONResponse(await unless_disconnected(request, collect))
    finally:
        await run.close()


async def _events(run: _Run, first: tuple[Generation, OutputChunk | None]) -> AsyncIterator[bytes]:
    try:
        async for piece in run.chunks(first):
            yield sse_event(piece)
        usage = run.assembler.usage_chunk()
        if usage is not None:
            yield sse_event(usage)
        yield SSE_DONE
    except ApiError as error:
        yield sse_event(error.body())
    except Exception:
        log.exception("completion stream failed")
        yield sse_event(internal().body())
