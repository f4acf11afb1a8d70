"""``EngineCoreClient``: the ``AsyncEngine`` interface over an engine core in another process.

The gateway process keeps the tokenizer (sent by the core once it is ready) for prompts and logprob
text; everything that touches the model runs in the core (``engine.frontend.core_process``). ``generate``
sends one ``AddRequest`` and awaits deltas; a receiver thread owns the output socket and hands each
step's deltas to the event loop of the stream they extend (``call_soon_threadsafe``), so no event
loop ever waits on the engine.

The two sockets live in ``engine.frontend.core_sockets``, the open streams in ``engine.frontend.core_streams``,
and what a core must offer and when a dead one restarts in ``engine.frontend.core_lifecycle``.

Death: the receiver looks at the core every ``WATCH_S``. When it is gone, every open stream ends
with an error delta (a realtime session turns it into an ``error`` event and a failed response, HTTP
into a 500 or a stream error), ``health()`` turns red, and the core is started again (a new epoch)
after a backoff. A restart loses the prefix cache and nothing else: requests are not replayed, their
clients were told. After ``max_restarts`` restarts in a row that die within a minute of starting, the
client stays down with the reason in ``health()``: a core that cannot start will not by retrying.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.errors import EngineDead, InvalidRequest, ModelLoadError
from omni_gateway.engine.frontend import ipc
from omni_gateway.engine.frontend.chat_stream import ChatStreaming
from omni_gateway.engine.frontend.chat_template import render_chat
from omni_gateway.engine.frontend.core_lifecycle import WATCH_S, CoreHandle, Launcher, plan_restart
from omni_gateway.engine.frontend.core_process import CoreSpec
from omni_gateway.engine.frontend.core_sockets import CoreSockets
from omni_gateway.engine.frontend.core_streams import OpenStream, fail_streams
from omni_gateway.engine.frontend.lora_calls import PendingLoraCalls, with_adapter
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineCoreClient(ChatStreaming):
    def __init__(
        self,
        config: EngineConfig,
        launcher: Launcher,
        *,
        threads: int | None = None,
        engine_factory: Any = None,
        max_restarts: int = 5,
        startup_timeout_s: float = 1800.0,
        name: str = "engine",
    ) -> None:
        self.config = config
        self.name = name
        self._launcher = launcher
        self._threads = threads
        self._engine_factory = engine_factory
        self._max_restarts = max_restarts
        self._startup_timeout_s = startup_timeout_s
        self._sockets = CoreSockets(launcher.host)
        self._lock = threading.Lock()  # guards state, streams and the command socket
        self._streams: dict[str, OpenStream] = {}
        self._state = "starting"  # starting | running | dead | failed | closed
        self._reason: str | None = None
        self._epoch = 0
        self._failures = 0  # starts in a row that died before serving
        self._restart_at = 0.0
        self._started_at = 0.0
        self._ready_at = 0.0
        self._handle: CoreHandle | None = None
        self._ready: ipc.Ready | None = None
        self._stats: dict[str, float] = {}
        self._lora_calls = PendingLoraCalls()
        self._first = threading.Event()
        self._launch()
        self._thread = threading.Thread(target=self._receive, name=f"{name}-receiver", daemon=True)
        self._thread.start()
        self._first.wait()
        if self._ready is None:
            reason = self._reason
            self.shutdown()
            raise ModelLoadError(f"{name} core did not start: {reason}")

    # ---- what the gateway reads without asking the core ------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._info.tokenizer

    @property
    def model_name(self) -> str:
        return self._info.model_name

    @property
    def max_model_len(self) -> int:
        return self._info.max_model_len

    @property
    def device_and_dtype(self) -> tuple[Any, Any]:
        """The core's torch device and dtype, for encoders in this process whose outputs feed it."""
        import torch

        return torch.device(self._info.device), getattr(torch, self._info.dtype)

    @property
    def pid(self) -> int:
        """The process id of the current core (on its own machine)."""
        return self._info.pid

    @property
    def alive(self) -> bool:
        return self._state == "running"

    @property
    def num_open_streams(self) -> int:
        return len(self._streams)

    @property
    def _info(self) -> ipc.Ready:
        assert self._ready is not None  # the constructor raised otherwise
        return self._ready

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
    ) -> str:
        prompt: str = render_chat(
            self.tokenizer,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template or self._info.chat_template,
        )
        return prompt

    # ---- caller side (any asyncio loop) --------------------------------------------------------

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        priority: int = 0,
        embed_spans: Iterable[EmbedSpan] = (),
        add_special_tokens: bool = True,
        session_id: str | None = None,  # replica affinity; one core has nothing to choose
    ) -> AsyncIterator[StreamDelta]:
        """Stream deltas until every completion of the request finished. Closing the iterator early
        aborts the request. Raises InvalidRequest, EngineOverloaded or EngineDead before the first delta."""
        params = params or SamplingParams()
        rid = request_id or f"req-{uuid.uuid4().hex}"
        stream = OpenStream(asyncio.get_running_loop(), params.n)
        with self._lock:
            if self._state != "running":
                raise EngineDead(f"{self.name} core is not running: {self._reason or self._state}")
            if rid in self._streams:
                raise InvalidRequest(f"request_id {rid!r} is already streaming")
            message = ipc.AddRequest(self._epoch, rid, prompt, params, priority, tuple(embed_spans), add_special_tokens)
            self._streams[rid] = stream  # before the send: the receiver may deliver the first delta at once
            if not self._sockets.send(message):
                del self._streams[rid]
                raise EngineDead(f"{self.name} core is not connected") from None
        complete = refused = False
        try:
            while True:
                item = await stream.items.get()
                if isinstance(item, BaseException):
                    refused = True
                    raise item
                if item.finished:
                    stream.finished += 1
                complete = item.error is not None or stream.finished >= stream.n
                yield item
                if complete:
                    return
        finally:
            with self._lock:
                self._streams.pop(rid, None)
            if not complete and not refused:
                self.abort(rid)

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish_reason "abort". Safe from any thread."""
        with self._lock:
            if self._state == "running":
                self._sockets.send(ipc.AbortRequest(self._epoch, request_id))

    async def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter in folder ``path`` as ``name`` (engine.core.llm_engine.LLMEngine.load_lora);
        raises what the core's engine raised. A core restarted later loads it again at start."""
        await self._lora_call(name, path)

    async def unload_lora(self, name: str) -> None:
        await self._lora_call(name, None)

    def lora_adapters(self) -> dict[str, str]:
        """Served adapter name -> folder: the ones the core loaded at start and those loaded since."""
        return dict(self.config.lora_modules)

    async def _lora_call(self, name: str, path: str | None) -> None:
        with self._lock:
            if self._state != "running":
                raise EngineDead(f"{self.name} core is not running: {self._reason or self._state}")
            ticket, future = self._lora_calls.open(name, path)
            if not self._sockets.send(ipc.LoraCall(self._epoch, ticket, name, path)):
                self._lora_calls.close(ticket, EngineDead(f"{self.name} core is not connected"), self._adapter_applied)
        await asyncio.wrap_future(future)

    def _adapter_applied(self, name: str, path: str | None) -> None:
        # A core restarted later starts with the adapters served now.
        self.config = replace(self.config, lora_modules=with_adapter(self.config.lora_modules, name, path))

    def health(self) -> dict[str, Any]:
        alive = self._state == "running"
        error = None if alive else f"{self.name} core {self._state}: {self._reason}"
        return {"alive": alive, "error": error, "open_streams": len(self._streams)}

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def wait_alive(self, timeout: float) -> bool:
        """Block until the core serves (after a restart), at most ``timeout`` seconds; whether it does."""
        deadline = time.monotonic() + timeout
        while self._state != "running" and time.monotonic() < deadline:
            if self._state in ("failed", "closed"):
                return False
            time.sleep(0.05)
        return self._state == "running"

    def kill(self) -> None:
        """Kill the core as a crash would (tests, operators): the client notices and restarts it."""
        if self._handle is not None:
            self._handle.kill()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort what is in flight, stop the core and wait for it."""
        with self._lock:
            if self._state == "closed":
                return
            running = self._state == "running"
            self._state, self._reason = "closed", "shut down"
            if running:
                self._sockets.send(ipc.Stop(self._epoch))
        # The receiver thread first: it restarts dead cores, and once it has stopped no core can start
        # behind this shutdown's back (a restart racing it would leave an orphan process).
        if getattr(self, "_thread", None) is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        handle = self._handle
        if handle is not None and not handle.join(timeout if running else 0.0):
            handle.kill()
            handle.join(5.0)
        self._fail_streams("shut down")
        self._sockets.close()
        self._launcher.close()

    # ---- receiver thread -------------------------------------------------------------------------

    def _launch(self) -> None:
        self._epoch += 1
        spec = CoreSpec(
            config=self.config,
            commands_address=self._sockets.commands_address,
            outputs_address=self._sockets.outputs_address,
            epoch=self._epoch,
            threads=self._threads,
            parent_pid=os.getpid() if self._launcher.host is None else None,
            engine_factory=self._engine_factory,
        )
        self._state, self._started_at = "starting", time.monotonic()
        try:
            self._handle = self._launcher.start(spec)
        except Exception as exc:  # noqa: BLE001 - a launch failure is one more failed start
            log.exception("%s: starting a core failed", self.name)
            self._handle = None
            self._down(f"{type(exc).__name__}: {exc}")

    def _receive(self) -> None:
        while self._state != "closed":
            messages = self._sockets.receive(WATCH_S)
            if messages is None:
                return
            for message in messages:
                self._handle_output(message)
            self._watch()

    def _handle_output(self, message: Any) -> None:
        if message.epoch != self._epoch or self._state == "closed":
            return  # left behind by a core that died
        if isinstance(message, ipc.StepOutput):
            if message.stats is not None:
                self._stats = message.stats
            for delta in message.deltas():
                self._deliver(delta.request_id, delta)
        elif isinstance(message, ipc.Refused):
            self._deliver(message.request_id, message.error)
        elif isinstance(message, ipc.LoraDone):
            self._lora_calls.close(message.ticket, message.error, self._adapter_applied)
        elif isinstance(message, ipc.Ready):
            self._ready = replace(message) if self._ready is None else replace(self._ready, pid=message.pid)
            self._stats = message.stats
            with self._lock:
                if self._state == "starting":
                    self._state, self._reason, self._ready_at = "running", None, time.monotonic()
            log.info("%s core ready (pid %d, epoch %d)", self.name, message.pid, message.epoch)
            self._first.set()
        elif isinstance(message, ipc.StartFailed):
            if self._handle is not None:
                self._handle.join(5.0)
            self._down(f"failed to start: {message.error}")

    def _watch(self) -> None:
        state = self._state
        if state in ("running", "starting") and self._handle is not None:
            reason = self._handle.exit_reason()
            if reason is None and state == "starting":
                if time.monotonic() - self._started_at > self._startup_timeout_s:
                    self._handle.kill()
                    reason = f"not ready after {self._startup_timeout_s:.0f} s"
            if reason is not None:
                self._down(reason)
        elif state == "dead" and time.monotonic() >= self._restart_at:
            log.warning("%s: restarting the core (attempt %d)", self.name, self._failures)
            self._launch()

    def _down(self, reason: str) -> None:
        """The core is gone: fail its streams, then schedule a restart or give up."""
        with self._lock:
            if self._state == "closed":
                return
            served_s = time.monotonic() - self._ready_at if self._state == "running" else None
            self._failures, give_up, delay = plan_restart(
                self._failures, served_s=served_s, ever_ready=self._ready is not None, max_restarts=self._max_restarts
            )
            self._state = "failed" if give_up else "dead"
            self._reason = reason
            self._restart_at = time.monotonic() + delay
        log.error(
            "%s core stopped: %s; %s",
            self.name,
            reason,
            "giving up" if give_up else f"restarting in {delay:.0f} s",
        )
        self._fail_streams(reason)
        self._lora_calls.fail_all(EngineDead(f"{self.name} core stopped before answering: {reason}"))
        self._first.set()

    def _fail_streams(self, reason: str) -> None:
        with self._lock:
            streams = dict(self._streams)
        fail_streams(streams, reason)

    def _deliver(self, request_id: str, item: StreamDelta | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and not stream.put(item):
            with self._lock:
                self._streams.pop(request_id, None)
