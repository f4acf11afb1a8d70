"""/v1/responses: create (streamed as Responses events or answered as one object), retrieve and delete.

A response runs as a chat completion does (``parse_responses`` rewrites it as one); what differs is the
shape of the answer and the store of earlier answers that ``previous_response_id`` continues.
"""

from __future__ import annotations

import logging
import time

import anyio
from omni_gateway.gateway.http.assembled import event_stream, feed_all
from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import ApiError
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.responses_output import ResponseAssembler
from omni_gateway.gateway.http.responses_request import ResponsesCall, parse_responses
from omni_gateway.gateway.http.responses_store import ResponseStore, StoredResponse
from omni_gateway.gateway.http.sampling import check_context
from omni_gateway.gateway.http.streaming import CancellableStream, sse_event, start, unless_disconnected
from omni_gateway.gateway.metrics import TokenTimer, count_tokens
from omni_gateway.omni.protocol import OmniBackend
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("omni_gateway.gateway.http")
API = "responses"


async def create(request: Request, backend: OmniBackend, limits: HttpLimits, *, store: ResponseStore) -> Response:
    body = await read_json(request, limits.max_body_bytes)
    caps = backend.capabilities
    call = await anyio.to_thread.run_sync(parse_responses, body, caps, limits, store)
    prompt_tokens = await anyio.to_thread.run_sync(backend.count_tokens, call.chat.request.messages)
    check_context(prompt_tokens, call.chat.request.sampling.max_tokens, caps)
    generation, first = await start(request, backend, call.chat.request)
    assembler = ResponseAssembler(call, int(time.time()))
    timer = TokenTimer(API)
    if call.stream:
        events = event_stream(
            generation,
            first,
            assembler,
            timer,
            api=API,
            error_event=lambda error: _error_event(assembler, error),
            completed=lambda: _keep(call, assembler, store),
        )
        return CancellableStream(events, cleanup=generation.close)
    try:
        await unless_disconnected(request, lambda: feed_all(generation, first, assembler, timer))
    finally:
        await generation.close()
    assembler.finish()
    _keep(call, assembler, store)
    return JSONResponse(assembler.body())


async def retrieve(request: Request, backend: OmniBackend, *, store: ResponseStore) -> Response:
    response_id = request.path_params["response_id"]
    return JSONResponse(_stored(store, response_id).body)


async def delete(request: Request, backend: OmniBackend, *, store: ResponseStore) -> Response:
    response_id = request.path_params["response_id"]
    _stored(store, response_id)
    store.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _stored(store: ResponseStore, response_id: str) -> StoredResponse:
    entry = store.get(response_id)
    if entry is None:
        raise ApiError(
            404, f"Response with id '{response_id[:100]}' not found.", param="response_id", code="response_not_found"
        )
    return entry


def _error_event(assembler: ResponseAssembler, error: ApiError) -> bytes:
    event = assembler.event("error", code=error.code, message=error.message, param=error.param)
    return sse_event(event, "error")


def _keep(call: ResponsesCall, assembler: ResponseAssembler, store: ResponseStore) -> None:
    if assembler.usage is not None:
        count_tokens(API, assembler.usage.input_tokens, assembler.usage.output_tokens)
    if call.store:
        store.put(call.response_id, StoredResponse(assembler.body(), assembler.conversation()))
