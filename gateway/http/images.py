"""POST /v1/images/generations: base64 PNGs, or partial and final images as server-sent events."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import ApiError, from_backend, internal
from omni_gateway.gateway.http.image_request import ImageCall, parse_image_generation
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.streaming import CancellableStream, Generation, sse_event, start, unless_disconnected
from omni_gateway.omni.protocol import Error, ImageFinal, ImagePartial, OmniBackend, OutputChunk, Usage
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("omni_gateway.gateway.http")


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "input_tokens_details": {"text_tokens": usage.input_tokens, "image_tokens": 0},
    }


def _event_fields(call: ImageCall, png: bytes) -> dict[str, Any]:
    return {
        "b64_json": base64.b64encode(png).decode(),
        "created_at": int(time.time()),
        "size": call.size,
        "quality": "auto",
        "background": "opaque",
        "output_format": "png",
    }


async def image_generations(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    call = parse_image_generation(await read_json(request, limits.max_body_bytes), backend.capabilities, limits)
    generation, first = await start(request, backend, call.request)
    if call.stream:
        response: Response = CancellableStream(_events(call, generation, first), cleanup=generation.close)
        return response
    try:
        return JSONResponse(await unless_disconnected(request, lambda: _collect(call, generation, first)))
    finally:
        await generation.close()


async def _chunks(generation: Generation, chunk: OutputChunk | None) -> AsyncIterator[OutputChunk]:
    while chunk is not None:
        if isinstance(chunk, Error):
            raise from_backend(chunk)
        yield chunk
        chunk = await generation.next()


async def _collect(call: ImageCall, generation: Generation, first: OutputChunk | None) -> dict[str, Any]:
    finals: dict[int, bytes] = {}
    usage = Usage()
    async for chunk in _chunks(generation, first):
        if isinstance(chunk, ImageFinal):
            finals[chunk.image_index] = chunk.png
        elif isinstance(chunk, Usage):
            usage = chunk
    if len(finals) != call.request.image.n:
        raise internal()
    return {
        "created": int(time.time()),
        "size": call.size,
        "output_format": "png",
        "usage": _usage(usage),
        "data": [{"b64_json": base64.b64encode(finals[i]).decode(), "revised_prompt": None} for i in sorted(finals)],
    }


async def _events(call: ImageCall, generation: Generation, first: OutputChunk | None) -> AsyncIterator[bytes]:
    finals: list[ImageFinal] = []
    sent_partials: dict[int, int] = {}
    usage = Usage()
    try:
        async for chunk in _chunks(generation, first):
            if isinstance(chunk, ImagePartial):
                count = sent_partials.get(chunk.image_index, 0)
                if count < call.partial_images:  # the backend may preview more often than asked
                    sent_partials[chunk.image_index] = count + 1
                    yield sse_event(
                        {
                            "type": "image_generation.partial_image",
                            "partial_image_index": count,
                            **_event_fields(call, chunk.png),
                        },
                        "image_generation.partial_image",
                    )
            elif isinstance(chunk, ImageFinal):
                finals.append(chunk)  # completed events carry usage, known only at the end of the stream
            elif isinstance(chunk, Usage):
                usage = chunk
        for final in finals:
            yield sse_event(
                {"type": "image_generation.completed", "usage": _usage(usage), **_event_fields(call, final.png)},
                "image_generation.completed",
            )
    except ApiError as error:
        yield sse_event(error.body(), "error")
    except Exception:
        log.exception("image stream failed")
        yield sse_event(internal().body(), "error")
