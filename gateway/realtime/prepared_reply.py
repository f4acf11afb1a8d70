"""A reply generated ahead of its response (``commands.Prepare``): the backend stream is read at once
and its chunks held, so that the response adopting it finds them ready; dropping it aborts the request."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from omni_gateway.gateway.realtime.generation import close_generation, fit_request
from omni_gateway.gateway.realtime.truncation import PromptWindow, Truncation
from omni_gateway.omni.protocol import OmniBackend, OmniRequest, OutputChunk

_END = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class PreparedReply:
    def __init__(self, backend: OmniBackend, request: OmniRequest, truncation: Truncation,
                 window: PromptWindow) -> None:
        self.request = request  # as built: a response adopts this reply when its own request is equal
        self._backend = backend
        self._truncation = truncation
        self._window = window  # the session's: the prompt starts where its responses' prompts do
        self._held: asyncio.Queue[object] = asyncio.Queue()  # bounded by the response's own output limit
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        stream = None
        exhausted = False
        try:
            stream = self._backend.generate(await fit_request(self._backend, self.request, self._truncation,
                                                              self._window))
            async for chunk in stream:
                self._held.put_nowait(chunk)
            exhausted = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # raised where the adopting response reads it
            self._held.put_nowait(_Failed(exc))
        finally:
            await close_generation(self._backend, stream, self.request.request_id, exhausted=exhausted)
            self._held.put_nowait(_END)

    async def chunks(self) -> AsyncIterator[OutputChunk]:
        """What the backend produced so far, then the rest as it comes."""
        while True:
            item = await self._held.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item  # type: ignore[misc]

    @property
    def task(self) -> asyncio.Task[None]:
        return self._task

    def drop(self) -> None:
        """Stop generating; the backend request is aborted on the way out of the pump."""
        self._task.cancel()
