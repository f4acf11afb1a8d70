"""The asyncio shell around one ``RealtimeSession``: a reader, a writer, and a task per session task.

The session decides everything; this layer moves frames, runs the tasks the session starts (a
transcription, a generation, a deadline) and feeds their outcomes back. Server events leave through
one outbox in the order the session produced them. A client that stops reading is bounded: once
its outbox holds more than ``send_queue_max`` events or ``send_queue_max_bytes``, or its oldest unsent
event has waited half of ``send_timeout_s``, the session stops generating for it and producers wait
(so what it holds stays bounded); once that event has waited ``send_timeout_s``, the socket closes
with 1008. Bytes alone never close it: one event may be larger than the bound (a long audio item
retrieved), and it is the waiting that tells a client that does not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from omni_gateway.gateway import metrics
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.http.lora import served_adapters
from omni_gateway.gateway.realtime.commands import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL,
    CancelTask,
    Close,
    Output,
    Send,
    StartTask,
    VadFactory,
    Work,
)
from omni_gateway.gateway.realtime.outbox import Outbox
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.gateway.realtime.settings import Dialect
from omni_gateway.gateway.realtime.tasks import run_task
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity
from omni_gateway.gateway.realtime.voice_timing import VoiceSink, VoiceTiming
from omni_gateway.omni.protocol import OmniBackend, VadSettings, VoiceActivityDetector
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009


class RealtimeConnection:
    def __init__(
        self,
        websocket: WebSocket,
        backend: OmniBackend,
        config: GatewayConfig,
        dialect: Dialect,
        vad_factory: VadFactory | None,
        intent: str = "realtime",
        capacity: VoiceCapacity | None = None,
        model: str | None = None,
    ) -> None:
        self.ws = websocket
        self.backend = backend
        self.config = config
        self._loop = asyncio.get_running_loop()
        # The process's voice admission hears this session's replies with every other's (None: nobody judges).
        sinks: tuple[VoiceSink, ...] = (
            (metrics.VoiceMetrics(),) if capacity is None else (metrics.VoiceMetrics(), capacity)
        )
        self.session = RealtimeSession(
            dialect=dialect,
            capabilities=backend.capabilities,
            vad_factory=None if vad_factory is None else self._listening(vad_factory),
            limits=config.session,
            intent=intent,
            count_tokens=backend.count_tokens,
            voice=VoiceTiming(*sinks),
            model=model,
            adapters=lambda: served_adapters(backend),
        )
        self._outbox = Outbox(config.send_queue_max, config.send_queue_max_bytes)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._close: tuple[int, str] | None = None
        self._stalled = False  # the session was told the client stopped reading; cleared once it drains
        self._state_changed = asyncio.Event()  # set after every dispatch: the idle watcher re-reads its deadline
        self._reader_task: asyncio.Task[None] | None = None
        self._send_watch: asyncio.TimerHandle | None = None  # the timer of the event being sent

    # ---- lifecycle ------------------------------------------------------------------------------
    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        idle = asyncio.create_task(self._idle_watch())
        self._reader_task = asyncio.create_task(self._reader())
        try:
            self._apply(self.session.open())
            await asyncio.wait_for(asyncio.shield(self._reader_task), timeout=self.session.limits.session_seconds)
        except TimeoutError:
            self._apply(self.session.on_expired())
        except asyncio.CancelledError:
            pass
        finally:
            for task in (idle, self._reader_task, *self._tasks.values()):
                task.cancel()  # each generation aborts its backend request on the way out
            await asyncio.gather(idle, self._reader_task, *self._tasks.values(), return_exceptions=True)
            await self._teardown(writer)

    async def _teardown(self, writer: asyncio.Task[None]) -> None:
        code, reason = self._close or (CLOSE_NORMAL, "")
        if code in (CLOSE_GOING_AWAY, CLOSE_INTERNAL):  # let the events that explain the close go out first
            self._outbox.end()
            await asyncio.wait({writer}, timeout=2.0)
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        if self.ws.application_state == WebSocketState.CONNECTED and self.ws.client_state == WebSocketState.CONNECTED:
            try:  # bounded: a client that stopped reading may never take the close frame
                await asyncio.wait_for(self.ws.close(code=code, reason=reason), timeout=2.0)
            except (TimeoutError, RuntimeError, OSError, WebSocketDisconnect):
                pass

    def backend_stopped(self) -> None:
        """End the session from outside: the model backend stopped."""
        self._apply(self.session.on_backend_stopped())

    def _abandon(self, code: int, reason: str) -> None:
        """Stop serving this socket from any task: the reader ends and teardown closes with ``code``."""
        if self._close is None:
            self._close = (code, reason)
        if self._reader_task is not None:
            self._reader_task.cancel()

    def _listening(self, factory: VadFactory) -> VadFactory:
        """``factory``, whose detectors tell this connection when they judged audio off the event loop."""

        def build(settings: VadSettings) -> VoiceActivityDetector:
            vad = factory(settings)
            vad.listen(self._vad_ready)
            return vad

        return build

    def _vad_ready(self) -> None:
        """From the detector's thread: hand its events to the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop closed: the session is over
            self._loop.call_soon_threadsafe(self._vad_events)

    def _vad_events(self) -> None:
        if self._reader_task is not None and not self._reader_task.done():
            self._apply(self.session.on_vad_events())

    # ---- reading --------------------------------------------------------------------------------
    async def _reader(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await self._dispatch(self.session.receive({"type": "binary frame"}))
            elif len(text) > self.config.max_frame_bytes:
                self._close = (CLOSE_TOO_BIG, f"message larger than {self.config.max_frame_bytes} bytes")
                return
            else:
                await self._dispatch(self.session.receive_text(text))

    # ---- writing --------------------------------------------------------------------------------
    async def _writer(self) -> None:
        while (item := await self._outbox.get()) is not None:
            text, queued_at = item
            # Nearly every send returns at once, so the event is sent in this task, watched by a timer,
            # rather than in a task of its own awaited with a timeout (its cost doubled an audio delta's).
            self._send_watch = self._loop.call_later(
                queued_at + self.config.send_timeout_s / 2 - time.monotonic(), self._send_slow, queued_at
            )
            try:
                await self.ws.send_text(text)
            except Exception:  # the socket is gone
                self._abandon(CLOSE_NORMAL, "")
                return
            finally:
                self._send_watch.cancel()
            if self._stalled and not self._outbox.over_bound:
                self._stalled = False
                self._apply(self.session.on_client_reading())
            if len(self._outbox):  # sends that never suspend: other sockets go out between this one's events
                await asyncio.sleep(0)

    def _send_slow(self, queued_at: float) -> None:
        """The event being sent has waited half the send timeout: generation stops for this client, and the
        socket closes once it has waited the whole timeout (teardown then cancels the send)."""
        self._stall()
        timeout = self.config.send_timeout_s
        self._send_watch = self._loop.call_later(
            queued_at + timeout - time.monotonic(),
            self._drop,
            f"client is not reading its events: one waited {timeout:g} s unsent",
        )

    def _drop(self, reason: str) -> None:
        log.info("closing realtime session %s (1008): %s", self.session.id, reason)
        self._abandon(CLOSE_POLICY, reason)

    def _stall(self) -> None:
        if not self._stalled:
            self._stalled = True
            self._apply(self.session.on_client_stalled())

    def _apply(self, outputs: list[Output]) -> None:
        """Queue the session's events and carry out its commands, in its order."""
        for out in outputs:
            if isinstance(out, Send):
                self._outbox.put(out.event)
            elif isinstance(out, StartTask):
                self._cancel(out.task_id)
                self._tasks[out.task_id] = asyncio.create_task(self._run_task(out.task_id, out.work))
            elif isinstance(out, CancelTask):
                self._cancel(out.task_id)
            elif isinstance(out, Close):
                self._abandon(out.code, out.reason)
        self._state_changed.set()
        if self._outbox.over_bound:
            self._stall()

    async def _dispatch(self, outputs: list[Output]) -> None:
        """``_apply``, then wait while the client lags behind."""
        self._apply(outputs)
        await self._outbox.space()

    def _cancel(self, task_id: str) -> None:
        task = self._tasks.pop(task_id, None)
        if task is not None:  # the current task too: it stops at its next await
            task.cancel()

    async def _idle_watch(self) -> None:
        """Fires the session's idle timeout (server_vad ``idle_timeout_ms``) when its deadline passes."""
        while True:
            self._state_changed.clear()
            deadline = self.session.idle_deadline
            delay = None if deadline is None else deadline - time.time()
            if delay is None or delay > 0:
                try:
                    await asyncio.wait_for(self._state_changed.wait(), timeout=delay)
                    continue  # something happened: the deadline may have moved
                except TimeoutError:
                    pass
            await self._dispatch(self.session.on_idle())

    # ---- tasks ----------------------------------------------------------------------------------
    async def _run_task(self, task_id: str, work: Work) -> None:
        try:
            await run_task(self.backend, self.session, task_id, work, self._dispatch)
        finally:
            if self._tasks.get(task_id) is asyncio.current_task():
                del self._tasks[task_id]
