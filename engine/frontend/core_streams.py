"""The open streams of ``EngineCoreClient`` and ``AsyncEngine``: the thread that reads the engine hands each delta
to the event loop of the stream it extends (``call_soon_threadsafe``), so no event loop ever waits on the engine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from omni_gateway.engine.outputs import StreamDelta


@dataclass(slots=True)
class OpenStream:
    loop: asyncio.AbstractEventLoop
    n: int
    items: asyncio.Queue[StreamDelta | BaseException] = field(default_factory=asyncio.Queue)
    finished: int = 0

    def put(self, item: StreamDelta | BaseException) -> bool:
        """Hand ``item`` to the stream's loop from any thread; False when nobody listens any more."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed; nobody is listening
            return False
        return True


def fail_streams(streams: dict[str, OpenStream], reason: str) -> None:
    """End every stream with an error delta: the core that served them is gone."""
    for rid, stream in streams.items():
        error = StreamDelta(
            request_id=rid,
            text="",
            token_ids=(),
            finished=True,
            finish_reason="error",
            error=f"engine stopped: {reason}",
        )
        stream.put(error)
