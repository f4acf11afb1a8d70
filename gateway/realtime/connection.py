"""The asyncio shell around one ``RealtimeSession``: a reader, a writer, a task per response and per ASR job.

The session decides everything; this layer only moves bytes and runs backend calls. Server events go
through one ordered outbox so they leave in exactly the order the session produced them; producers
wait while the outbox is over its bound, and a client that reads nothing for ``send_timeout_s`` is
disconnected rather than buffered without limit.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omni_gateway.gateway import metrics
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.errors import client_safe
from omni_gateway.gateway.realtime.commands import (AdoptSpeculation, CancelResponse, DropSpeculation, Output, Prepare, Send,
                                       Speculate, StartResponse, Transcribe, VadFactory, new_id)
from omni_gateway.gateway.realtime.generation import close_generation, fit_request
from omni_gateway.gateway.realtime.prepared_reply import PreparedReply
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.gateway.realtime.settings import Dialect
from omni_gateway.gateway.realtime.truncation import PromptWindow, Truncation, parse_truncation
from omni_gateway.omni.protocol import AudioChunk, Error, OmniBackend, OmniRequest, OutputChunk, TextDelta, Transcription, Usage

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011


_END: dict[str, Any] = {}  # queued by teardown: the writer stops after sending what precedes it


class _SlowClient(Exception):
    pass


class RealtimeConnection:
    def __init__(self, websocket: WebSocket, backend: OmniBackend, config: GatewayConfig, dialect: Dialect,
                 vad_factory: VadFactory | None, intent: str = "realtime") -> None:
        self.ws = websocket
        self.backend = backend
        self.config = config
        self.session = RealtimeSession(dialect=dialect, capabilities=backend.capabilities, vad_factory=vad_factory,
                                       limits=config.session, intent=intent)
        self._outbox: deque[dict[str, Any]] = deque()
        self._has_data = asyncio.Event()
        self._space = asyncio.Event()
        self._responses: dict[str, asyncio.Task[None]] = {}
        self._asr: dict[str, asyncio.Task[None]] = {}
        self._speculations: dict[str, asyncio.Task[Transcription | None]] = {}  # by the item id the turn will take
        self._prepared: dict[str, PreparedReply] = {}  # replies to speculative transcripts, by the same id
        self._window = PromptWindow()  # where this session's prompts start once the conversation outgrows the model
        self._close: tuple[int, str] = (CLOSE_NORMAL, "")
        self._state_changed = asyncio.Event()  # set after every dispatch: the idle watcher re-reads its deadline
        self._reader_task: asyncio.Task[None] | None = None

    # ---- lifecycle ------------------------------------------------------------------------------
    async def run(self) -> None:
        writer = asyncio.create_task(self._writer())
        idle = asyncio.create_task(self._idle_watch())
        self._reader_task = asyncio.create_task(self._read_until_expiry())
        try:
            await self._dispatch(self.session.open())
            await self._reader_task
        except (asyncio.CancelledError, _SlowClient):
            pass
        finally:
            idle.cancel()
            await asyncio.gather(idle, return_exceptions=True)
            await self._teardown(writer)

    async def _read_until_expiry(self) -> None:
        try:
            await asyncio.wait_for(self._reader(), timeout=self.config.session.session_seconds)
        except asyncio.TimeoutError:
            minutes = self.config.session.session_seconds // 60
            message = f"Your session hit the maximum duration of {minutes} minutes."
            self._outbox.append({"event_id": new_id("event"), "type": "error", "error": {
                "type": "invalid_request_error", "code": "session_expired", "message": message, "param": None,
                "event_id": None}})
            self._has_data.set()
            self._close = (CLOSE_GOING_AWAY, message)
        except _SlowClient:
            return

    async def _teardown(self, writer: asyncio.Task[None]) -> None:
        tasks = [*self._responses.values(), *self._asr.values(), *self._speculations.values(),
                 *(prepared.task for prepared in self._prepared.values())]
        for task in tasks:
            task.cancel()  # each response task aborts its backend request on the way out
        await asyncio.gather(*tasks, return_exceptions=True)
        code, reason = self._close
        if code in (CLOSE_GOING_AWAY, CLOSE_INTERNAL):  # let the error that explains the close go out first
            self._outbox.append(_END)
            self._has_data.set()
            try:
                await asyncio.wait_for(asyncio.shield(writer), timeout=2.0)
            except (asyncio.TimeoutError, Exception):
                pass
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        if self.ws.application_state == WebSocketState.CONNECTED and \
                self.ws.client_state == WebSocketState.CONNECTED:
            try:  # bounded: a client that stopped reading may never take the close frame
                await asyncio.wait_for(self.ws.close(code=code, reason=reason), timeout=2.0)
            except (asyncio.TimeoutError, RuntimeError, OSError, WebSocketDisconnect):
                pass

    def fail(self, error: dict[str, Any], reason: str) -> None:
        """End the session from outside (the backend died): ``error`` is its last event, then close 1011."""
        self._outbox.append({"event_id": new_id("event"), "type": "error", "error": error})
        self._has_data.set()
        self._abandon(CLOSE_INTERNAL, reason)

    def _abandon(self, code: int, reason: str) -> None:
        """Stop serving this socket from any task: the reader ends and teardown closes with ``code``."""
        self._close = (code, reason)
        if self._reader_task is not None:
            self._reader_task.cancel()

    # ---- reading --------------------------------------------------------------------------------
    async def _reader(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await self._dispatch(self.session.receive({"type": "binary frame"}))
                continue
            if len(text) > self.config.max_frame_bytes:
                self._close = (CLOSE_TOO_BIG, f"message larger than {self.config.max_frame_bytes} bytes")
                return
            try:
                outputs = self.session.receive_text(text)
            except Exception:
                log.exception("realtime session failed on a client event")
                outputs = [Send({"event_id": new_id("event"), "type": "error", "error": {
                    "type": "server_error", "code": "server_error", "param": None, "event_id": None,
                    "message": "The server had an error while processing your request."}})]
            await self._dispatch(outputs)

    # ---- writing --------------------------------------------------------------------------------
    async def _writer(self) -> None:
        high = self.config.send_queue_max
        while True:
            while not self._outbox:
                self._has_data.clear()
                await self._has_data.wait()
            event = self._outbox.popleft()
            if event is _END:
                return
            if len(self._outbox) <= high // 2:
                self._space.set()
            try:
                await self.ws.send_text(json.dumps(event, separators=(",", ":"), ensure_ascii=False))
            except UnicodeEncodeError:  # lone surrogates from the client's JSON escapes: send them escaped
                await self.ws.send_text(json.dumps(event, separators=(",", ":")))

    async def _dispatch(self, outputs: list[Output]) -> None:
        """Queue events and run commands in the session's order, then wait while the client lags."""
        for out in outputs:
            if isinstance(out, Send):
                self._outbox.append(out.event)
            elif isinstance(out, StartResponse):
                prepared = self._take_prepared(out.response_id) if out.prepared else None
                if len(self._responses) < self.config.session.max_responses:
                    # Out-of-band responses (conversation "none") may overlap; each holds an engine request.
                    task = asyncio.create_task(self._run_response(out, prepared))
                else:
                    if prepared is not None:
                        prepared.drop()
                    task = asyncio.create_task(self._refuse_response(out))
                self._responses[out.response_id] = task
            elif isinstance(out, CancelResponse):
                task = self._responses.pop(out.response_id, None)
                if task is not None and task is not asyncio.current_task():
                    task.cancel()
            elif isinstance(out, Transcribe):
                self._asr[out.item_id] = asyncio.create_task(self._transcribe(out))
            elif isinstance(out, Speculate):
                self._drop_speculation(out.job.item_id)
                self._speculations[out.job.item_id] = asyncio.create_task(self._speculate(out.job))
            elif isinstance(out, DropSpeculation):
                self._drop_speculation(out.item_id)
            elif isinstance(out, Prepare):
                self._drop_speculation(out.item_id, keep_transcription=True)
                self._prepared[out.item_id] = PreparedReply(self.backend, out.request, self._truncation(),
                                                            self._window)
            elif isinstance(out, AdoptSpeculation):
                speculation = self._speculations.pop(out.job.item_id, None)
                self._asr[out.job.item_id] = asyncio.create_task(self._transcribe(out.job, speculation))
        self._has_data.set()
        self._state_changed.set()
        if len(self._outbox) > self.config.send_queue_max:
            self._space.clear()
            try:
                await asyncio.wait_for(self._space.wait(), timeout=self.config.send_timeout_s)
            except asyncio.TimeoutError:
                self._abandon(CLOSE_POLICY, "client is not reading its events")
                raise _SlowClient() from None

    async def _idle_watch(self) -> None:
        """Fires the session's idle timeout (server_vad ``idle_timeout_ms``) when its deadline passes."""
        try:
            while True:
                self._state_changed.clear()
                deadline = self.session.idle_deadline
                delay = None if deadline is None else deadline - time.time()
                if delay is None or delay > 0:
                    try:
                        await asyncio.wait_for(self._state_changed.wait(), timeout=delay)
                        continue  # something happened: the deadline may have moved
                    except asyncio.TimeoutError:
                        pass
                await self._dispatch(self.session.on_idle())
        except _SlowClient:
            pass

    # ---- backend work ---------------------------------------------------------------------------
    async def _run_response(self, cmd: StartResponse, prepared: PreparedReply | None = None) -> None:
        try:
            pending = [self._asr[i] for i in cmd.wait_for if i in self._asr]
            if pending:
                await asyncio.wait(pending, timeout=self.config.session.asr_timeout_s)
            try:
                request = self.session.build_request(cmd.response_id)
            except Exception:
                log.exception("building the request of %s failed", cmd.response_id)
                await self._dispatch(self.session.on_stream_end(cmd.response_id, "The request could not be built."))
                return
            if request is None:
                return
            await self._stream(cmd.response_id, request, prepared)
        except _SlowClient:
            pass
        finally:
            if prepared is not None:
                prepared.drop()  # a no-op once its stream ended; else the response went away first
            self._responses.pop(cmd.response_id, None)

    async def _refuse_response(self, cmd: StartResponse) -> None:
        limit = self.config.session.max_responses
        refusal = Error("rate_limit_exceeded", f"This session already runs {limit} responses; wait for one to "
                        "finish.", status=429)
        try:
            await self._dispatch(self.session.on_chunk(cmd.response_id, refusal))
            await self._dispatch(self.session.on_stream_end(cmd.response_id))
        except _SlowClient:
            pass
        finally:
            self._responses.pop(cmd.response_id, None)

    async def _stream(self, response_id: str, request: OmniRequest, prepared: PreparedReply | None = None) -> None:
        """The backend's chunks for ``request`` into the session; from ``prepared`` when one was started
        for it (same request id), else from a new generation."""
        stream: AsyncIterator[OutputChunk] | None = None
        exhausted = False
        timer = metrics.TokenTimer("realtime")
        try:
            if prepared is not None:
                stream = prepared.chunks()
            else:
                stream = self.backend.generate(await fit_request(self.backend, request, self._truncation(),
                                                                 self._window))
            async for chunk in stream:
                if isinstance(chunk, (TextDelta, AudioChunk)):
                    timer.tick()
                elif isinstance(chunk, Usage):
                    metrics.count_tokens("realtime", chunk.input_tokens, chunk.output_tokens)
                elif isinstance(chunk, Error):
                    chunk = client_safe(chunk)
                await self._dispatch(self.session.on_chunk(response_id, chunk))
            exhausted = True
            await self._dispatch(self.session.on_stream_end(response_id))
        except (asyncio.CancelledError, _SlowClient):
            raise
        except Exception:
            log.exception("backend generation failed for %s", response_id)
            await self._dispatch(self.session.on_stream_end(response_id, "The backend failed while generating."))
        finally:
            await close_generation(self.backend, stream, request.request_id, exhausted=exhausted)

    def _truncation(self) -> Truncation:
        return parse_truncation(self.session.settings.truncation)  # validated by session.update

    def _drop_speculation(self, item_id: str, *, keep_transcription: bool = False) -> None:
        task = None if keep_transcription else self._speculations.pop(item_id, None)
        if task is not None:
            task.cancel()
        prepared = self._prepared.pop(item_id, None)
        if prepared is not None:
            prepared.drop()

    def _take_prepared(self, response_id: str) -> PreparedReply | None:
        for item_id, prepared in self._prepared.items():
            if prepared.request.request_id == response_id:
                return self._prepared.pop(item_id)
        return None

    async def _speculate(self, job: Transcribe) -> Transcription | None:
        try:
            result = await self.backend.transcribe(job.pcm16, job.sample_rate, language=job.language,
                                                   prompt=job.prompt)
        except Exception as exc:  # the commit transcribes its own audio then, and reports that outcome
            log.info("speculative transcription of %s failed: %s", job.item_id, exc)
            return None
        try:
            # Still in the pause: the session may start preparing the reply to these words.
            await self._dispatch(self.session.on_speculation(job, result))
        except _SlowClient:
            pass
        return result

    @staticmethod
    async def _speculated(speculation: asyncio.Task[Transcription | None]) -> Transcription | None:
        """The speculation's transcript, or None when it failed or was cancelled."""
        await asyncio.wait({speculation})  # waits without taking the speculation's cancellation as ours
        return None if speculation.cancelled() else speculation.result()

    async def _transcribe(self, cmd: Transcribe,
                          speculation: asyncio.Task[Transcription | None] | None = None) -> None:
        try:
            try:
                result = await self._speculated(speculation) if speculation is not None else None
                if result is None:
                    result = await self.backend.transcribe(cmd.pcm16, cmd.sample_rate, language=cmd.language,
                                                           prompt=cmd.prompt)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("transcription of %s failed: %s", cmd.item_id, exc)
                outputs = self.session.on_transcription_failed(cmd.item_id, "Transcription failed.")
            else:
                outputs = self.session.on_transcription(cmd.item_id, result)
            await self._dispatch(outputs)
        except _SlowClient:
            pass
        except Exception:  # a bug here must not leave an unobserved task failure behind
            log.exception("handling the transcription of %s failed", cmd.item_id)
        finally:
            self._asr.pop(cmd.item_id, None)
