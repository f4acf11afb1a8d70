"""Streaming front of the engine for asyncio callers; the engine loop runs in its own thread.

The two sides talk through plain messages: commands go to the loop thread through a queue, deltas
come back to each stream's event loop with ``call_soon_threadsafe``. Deltas are coalesced per step
(one per completion per step), so output queues stay short without a bound; the bound that matters,
the waiting queue, is enforced by the scheduler (EngineOverloaded).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.errors import EngineDead, InvalidRequest
from omni_gateway.engine.frontend.chat_stream import ChatStreaming
from omni_gateway.engine.frontend.core_streams import OpenStream, fail_streams
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.runner.step_priority import StepPriority
from omni_gateway.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

# stats() walks every held block; a busy loop refreshes the snapshot at this period, an idle one at once.
_STATS_PERIOD_S = 0.25
# A loop whose every request waits for input rows (engine.runner.input_stream) sleeps until one arrives (the
# stream wakes it); it looks again after this long whatever happens.
_INPUT_POLL_S = 0.05
# A step that some requests could take while others wait for rows that are arriving: a producer's step
# reaches its streams one at a time from another thread, so while rows keep arriving the loop waits for the
# rest, until none has arrived for _ROWS_QUIET_S or _GATHER_MAX_S has passed, and one step carries them all.
# When no row arrived within _ROWS_QUIET_S, nothing is on its way and the step goes at once. Requests that
# bring an input stream are a producer's too (a thinker step starts several sessions' talkers, one at a
# time): the step that would admit them waits for the rest the same way, and one prefill takes them all.
_ROWS_QUIET_S = 0.0015
_GATHER_MAX_S = 0.005


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    priority: int
    embed_spans: tuple[EmbedSpan, ...]
    add_special_tokens: bool
    done: concurrent.futures.Future[None]
    input_stream: InputStream | None = None
    grammar: Any = None  # params.structured_outputs prepared (engine.core.structured_output.Prepared)


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Call:
    """Run ``fn`` on the engine between steps (a LoRA adapter loaded or unloaded)."""

    fn: Callable[[LLMEngine], None]
    done: concurrent.futures.Future[None]


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


@dataclass(frozen=True, slots=True)
class _Wake:
    """An input row arrived."""


_WAKE = _Wake()


class AsyncEngine(ChatStreaming):
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        engine: LLMEngine | None = None,
        after_step: Callable[[list[StreamDelta]], None] | None = None,
    ) -> None:
        """``after_step`` sees every step's deltas on the loop thread before they are delivered: work that
        must batch across requests between two steps (Qwen3-Omni's code predictor fills in each frame and
        hands the talker its next input rows there, so the next step need not wait for them)."""
        self.engine = engine if engine is not None else LLMEngine(config or EngineConfig())
        self._after_step = after_step
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop | _Wake] = queue.SimpleQueue()
        self._streams: dict[str, OpenStream] = {}
        self._lock = threading.Lock()
        self._row_arrived_at = 0.0  # time.monotonic() of the latest input row (written by producers)
        self._dead: str | None = None  # why the loop stopped; set once
        self._stats: dict[str, float] = self.engine.stats()
        self._prefers: StepPriority | None = None  # shared with the engine this one's admissions go ahead of
        self._yields: StepPriority | None = None  # shared with the engine whose admissions this one waits for
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.model.name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def device_and_dtype(self) -> tuple[Any, Any]:
        """The torch device and dtype the model runs in, for encoders whose outputs feed it."""
        runner = self.engine.runner
        return runner.device, getattr(runner, "dtype", None)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
    ) -> str:
        """The prompt text of a conversation, with the model's chat template (reads immutable state only)."""
        return self.engine.render_chat(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, chat_template=chat_template
        )

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
        input_stream: InputStream | None = None,
        session_id: str | None = None,  # replica affinity; one engine has nothing to choose
    ) -> AsyncIterator[StreamDelta]:
        """Stream deltas until every completion of the request finished. Closing the iterator early
        aborts the request. Raises InvalidRequest, EngineOverloaded or EngineDead before the first delta."""
        params = params or SamplingParams()
        grammar = None
        if params.structured_outputs is not None:
            # Compiled on the grammar pool, off the engine loop (and off this event loop), within the budget;
            # leaving this generator (the client left) withdraws it.
            grammars = self.engine.grammars
            try:
                grammar = await asyncio.wait_for(
                    asyncio.wrap_future(grammars.submit(params.structured_outputs)), grammars.timeout_s
                )
            except TimeoutError:
                raise grammars.over_budget(params.structured_outputs) from None
        rid = request_id or f"req-{uuid.uuid4().hex}"
        stream = OpenStream(asyncio.get_running_loop(), params.n)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None:
                raise EngineDead(f"engine loop is not running: {self._dead}")
            if rid in self._streams:
                raise InvalidRequest(f"request_id {rid!r} is already streaming")
            self._streams[rid] = stream
            self._commands.put(
                _Add(rid, prompt, params, priority, tuple(embed_spans), add_special_tokens, done, input_stream, grammar)
            )
        complete = False
        try:
            await asyncio.wrap_future(done)
            while True:
                delta = await stream.items.get()
                assert isinstance(delta, StreamDelta)  # this engine's streams carry deltas only
                if delta.finished:
                    stream.finished += 1
                complete = delta.error is not None or stream.finished >= stream.n
                yield delta
                if complete:
                    return
        finally:
            with self._lock:
                self._streams.pop(rid, None)
            rejected = done.done() and not done.cancelled() and done.exception() is not None
            if not complete and not rejected:
                self.abort(rid)

    def prefer_over(self, other: object) -> None:
        """Let this engine's steps that admit requests with input streams go ahead of ``other``'s steps
        (see ``engine.runner.step_priority``), where ``other`` is another engine loop of this process; anything
        else (an engine in another process) is left alone. Idempotent."""
        if (
            not isinstance(other, AsyncEngine)
            or other is self
            or (other._yields is not None and other._yields is self._prefers)
        ):
            return
        priority = StepPriority()
        self._prefers, other._yields = priority, priority

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish_reason "abort". Safe from any thread."""
        self._commands.put(_Abort(request_id))

    async def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter in folder ``path`` as ``name``, loaded on the engine loop between two steps
        (engine.core.llm_engine.LLMEngine.load_lora); raises what it raises."""
        await self._call(lambda engine: engine.load_lora(name, path))

    async def unload_lora(self, name: str) -> None:
        await self._call(lambda engine: engine.unload_lora(name))

    def lora_adapters(self) -> dict[str, str]:
        """Served adapter name -> the folder it was loaded from."""
        return self.engine.lora_adapters()

    async def _call(self, fn: Callable[[LLMEngine], None]) -> None:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None:
                raise EngineDead(f"engine loop is not running: {self._dead}")
            self._commands.put(_Call(fn, done))
        await asyncio.wrap_future(done)

    def health(self) -> dict[str, Any]:
        alive = self._thread.is_alive() and self._dead is None
        return {"alive": alive, "error": self._dead if not alive else None, "open_streams": len(self._streams)}

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort what is in flight, stop the loop thread and wait for it."""
        self._commands.put(_Stop())
        self._thread.join(timeout)

    # ---- loop thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        stats_at = time.monotonic()
        try:
            while True:
                if not engine.has_unfinished():
                    command = self._commands.get()
                elif engine.waits_for_input():  # an arriving row wakes it (_row_arrived)
                    command = self._next_command(_INPUT_POLL_S)
                else:
                    command = self._next_command()
                while command is not None:
                    if isinstance(command, _Stop):
                        self._stop_all()
                        return
                    self._apply(command)
                    command = self._next_command()
                if engine.has_unfinished():
                    self._gather_rows()
                    deltas = self._step()
                    engine.pop_finished()
                    if self._after_step is not None and deltas:
                        self._after_step(deltas)
                    for delta in deltas:
                        self._deliver(delta)
                now = time.monotonic()
                if not engine.has_unfinished() or now - stats_at >= _STATS_PERIOD_S:
                    self._stats, stats_at = engine.stats(), now
        except BaseException as exc:  # noqa: BLE001 - the loop must report any failure to its streams
            log.exception("engine loop failed")
            self._die(f"{type(exc).__name__}: {exc}")

    def _step(self) -> list[StreamDelta]:
        engine = self.engine
        if self._yields is not None:
            self._yields.wait_turn()
        if self._prefers is not None and engine.admits_streamed():
            with self._prefers.admitting():
                return engine.step()
        return engine.step()

    def _next_command(self, wait_s: float = 0.0) -> _Add | _Abort | _Call | _Stop | _Wake | None:
        try:
            return self._commands.get(timeout=wait_s) if wait_s else self._commands.get_nowait()
        except queue.Empty:
            return None

    def _gather_rows(self) -> None:
        """While some requests could step and others wait for input rows that keep arriving, or the
        step would admit requests with input streams while more keep arriving, wait for them (see
        _ROWS_QUIET_S): one step for all, not one per part that happened to have arrived."""
        deadline = time.monotonic() + _GATHER_MAX_S
        engine = self.engine
        while engine.partly_waits_for_input() or engine.admits_streamed():
            now = time.monotonic()
            wait = min(self._row_arrived_at + _ROWS_QUIET_S, deadline) - now
            if wait <= 0:
                return  # quiet: the rest is not on its way now
            command = self._next_command(wait)
            if command is None:
                return
            if isinstance(command, _Stop):
                self._commands.put(command)  # the loop stops after this step
                return
            self._apply(command)

    def _apply(self, command: _Add | _Abort | _Call | _Wake) -> None:
        if isinstance(command, _Wake):
            return  # the loop looks at the streams again
        if isinstance(command, _Call):
            if command.done.set_running_or_notify_cancel():
                try:
                    command.fn(self.engine)
                except Exception as exc:  # noqa: BLE001 - a refused adapter belongs to the caller
                    command.done.set_exception(exc)
                else:
                    command.done.set_result(None)
            return
        if isinstance(command, _Abort):
            for delta in self.engine.abort(command.request_id):
                self._deliver(delta)
            self.engine.pop_finished()
            return
        if not command.done.set_running_or_notify_cancel():
            return  # the caller stopped waiting before the request was added
        try:
            self.engine.add_request(
                command.request_id,
                command.prompt,
                command.params,
                priority=command.priority,
                embed_spans=command.embed_spans,
                add_special_tokens=command.add_special_tokens,
                input_stream=command.input_stream,
                grammar=command.grammar,
            )
        except Exception as exc:  # noqa: BLE001 - validation errors belong to the caller
            command.done.set_exception(exc)
        else:
            if command.input_stream is not None:
                command.input_stream.listen(self._row_arrived)
                self._row_arrived_at = time.monotonic()  # an arrival too: see _gather_rows
            command.done.set_result(None)

    def _row_arrived(self) -> None:
        self._row_arrived_at = time.monotonic()
        self._commands.put(_WAKE)

    def _deliver(self, delta: StreamDelta) -> None:
        stream = self._streams.get(delta.request_id)
        if stream is None:
            return
        if not stream.put(delta):  # the caller's event loop is closed; nobody is listening
            self._streams.pop(delta.request_id, None)

    def _stop_all(self) -> None:
        for delta in self.engine.abort_all():
            self._deliver(delta)
        self.engine.pop_finished()
        self._die("engine was shut down")

    def _die(self, reason: str) -> None:
        with self._lock:
            self._dead = reason
            streams = dict(self._streams)
        fail_streams(streams, reason)
        while (command := self._next_command()) is not None:
            if isinstance(command, (_Add, _Call)) and command.done.set_running_or_notify_cancel():
                command.done.set_exception(EngineDead(f"engine loop is not running: {reason}"))
