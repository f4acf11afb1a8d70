"""A generation read through an assembler that turns output chunks into one API's objects and events: the
loop the Responses and Anthropic Messages endpoints share. Each API keeps its own shapes and error events."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from omni_gateway.gateway.http.errors import ApiError, internal
from omni_gateway.gateway.http.streaming import Generation, sse_event
from omni_gateway.gateway.metrics import TokenTimer
from omni_gateway.omni.protocol import OutputChunk, TextDelta

log = logging.getLogger("omni_gateway.gateway.http")


class Assembler(Protocol):
    def start(self) -> list[dict[str, Any]]: ...
    def feed(self, chunk: OutputChunk) -> list[dict[str, Any]]: ...
    def finish(self) -> list[dict[str, Any]]: ...
    def body(self) -> dict[str, Any]: ...


async def feed_all(generation: Generation, chunk: OutputChunk | None, assembler: Assembler, timer: TokenTimer) -> None:
    """Feeds every chunk, ``chunk`` (already read) first; a non-streamed answer reads ``assembler.body()`` after."""
    while chunk is not None:
        if isinstance(chunk, TextDelta):
            timer.tick()
        assembler.feed(chunk)
        chunk = await generation.next()


async def event_stream(
    generation: Generation,
    chunk: OutputChunk | None,
    assembler: Assembler,
    timer: TokenTimer,
    *,
    api: str,
    error_event: Callable[[ApiError], bytes],
    completed: Callable[[], None] = lambda: None,
    closed: Callable[[], None] = lambda: None,
) -> AsyncIterator[bytes]:
    """The streamed answer as server-sent events, each named by its ``type``. Once streaming, the status line is
    sent, so a failure travels as the API's own error event (``error_event``). ``completed`` runs when the answer
    ran to its end, ``closed`` whatever happened; the generation is closed in every case."""
    try:
        for event in assembler.start():
            yield sse_event(event, event["type"])
        while chunk is not None:
            if isinstance(chunk, TextDelta):
                timer.tick()
            for event in assembler.feed(chunk):
                yield sse_event(event, event["type"])
            chunk = await generation.next()
        for event in assembler.finish():
            yield sse_event(event, event["type"])
        completed()
    except ApiError as error:
        yield error_event(error)
    except Exception:
        log.exception("%s stream failed", api)
        yield error_event(internal())
    finally:
        await generation.close()
        closed()
