"""Running backend generations for HTTP requests, so that a client who leaves cancels them.

A generation that did not run to completion is always ended twice over: closing the async iterator
cancels every stage, and ``backend.abort`` frees the engine's request even if the iterator ignored the
close. Cleanup runs shielded, because under anyio a cancelled scope re-raises at every await.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from omni_gateway.gateway.http.errors import from_backend
from omni_gateway.omni.protocol import Error, OmniBackend, OmniRequest, OutputChunk
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


class Generation:
    """One backend stream, read chunk by chunk."""

    def __init__(self, backend: OmniBackend, request: OmniRequest) -> None:
        self._backend = backend
        self.request_id = request.request_id
        self._iterator = aiter(backend.generate(request))
        self._finished = False
        self._closed = False

    async def next(self) -> OutputChunk | None:
        """The next chunk, or ``None`` once the stream ended."""
        try:
            return await anext(self._iterator)
        except StopAsyncIteration:
            self._finished = True
            return None

    async def close(self) -> None:
        """Cancel the stream unless it ran to completion; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if self._finished:
            return
        with anyio.CancelScope(shield=True):
            aclose = getattr(self._iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            await self._backend.abort(self.request_id)


async def start(
    request: Request, backend: OmniBackend, omni_request: OmniRequest
) -> tuple[Generation, OutputChunk | None]:
    """Open a generation and wait for its first chunk, so that an immediate ``Error`` chunk (overload,
    invalid input) still becomes a plain HTTP error with its status instead of an event in a 200 stream."""
    generation = Generation(backend, omni_request)
    try:
        first = await unless_disconnected(request, generation.next)
        if isinstance(first, Error):
            raise from_backend(first)
    except BaseException:
        await generation.close()
        raise
    return generation, first


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` (once the body was read) while watching the connection; raises ``ClientGone``
    and cancels ``work`` when the client leaves first."""
    result: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            try:
                result.append(await work())
            except Exception as error:  # re-raised as is below, not wrapped in an ExceptionGroup
                failure.append(error)
            group.cancel_scope.cancel()

        async def watch() -> None:
            await wait_for_disconnect(request.receive)
            group.cancel_scope.cancel()

        group.start_soon(run)
        group.start_soon(watch)
    if failure:
        raise failure[0]
    if not result:
        raise ClientGone
    return result[0]


def sse_event(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


class CancellableStream(StreamingResponse):
    """A streamed body (server-sent events by default, or raw audio) that stops as soon as the client
    disconnects, whatever ASGI spec version the server speaks, and that always runs ``cleanup``, even
    when the body was never iterated."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        cleanup: Callable[[], Awaitable[None]],
        media_type: str = "text/event-stream",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            content,
            media_type=media_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self.stream_response(send)
                    group.cancel_scope.cancel()

                async def watch() -> None:
                    await wait_for_disconnect(receive)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(watch)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._cleanup()
