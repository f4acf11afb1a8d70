"""The engine core in its own process: scheduler, runner and the ``LLMEngine.step`` loop behind ZeroMQ.

``run_core`` is the whole life of one core process (a ``multiprocessing`` spawn child, or the body of
a Ray actor): load and warm the model, say ``Ready``, then loop: take every waiting command, run one
step, send its deltas as one message. It hosts whatever the engine config describes; an engine that
spreads a model over several devices starts its rank workers from inside it.

Constraint grammars compile on the grammar pool (``GrammarCache.submit``), off the step loop: the request
joins the batch when its grammar is ready (the same order of events as in-process, where the caller
compiles before adding). A compile past the engine's budget is refused; an abort withdraws it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.frontend import ipc

log = logging.getLogger(__name__)

_STATS_PERIOD_S = 0.25  # a busy core sends a stats snapshot at this period, an idle one after every change
_IDLE_POLL_MS = 250  # how often an idle core looks whether the process that started it is still there


@dataclass(frozen=True, slots=True)
class CoreSpec:
    """Everything a core process needs, picklable: it crosses the spawn (or the Ray actor call)."""

    config: EngineConfig
    commands_address: str
    outputs_address: str
    epoch: int
    threads: int | None = None  # torch intra-op threads on the CPU; None leaves torch's default
    parent_pid: int | None = None  # exit when this process is gone (same machine only)
    # Builds the engine from the config; None: ``LLMEngine``. A module-level function (it is pickled).
    engine_factory: Callable[[EngineConfig], Any] | None = None
    env: tuple[tuple[str, str], ...] = ()  # set before torch loads (the replica's CUDA_VISIBLE_DEVICES)


def run_core(spec: CoreSpec) -> None:
    """Serve until a ``Stop`` arrives, the parent disappears or the loop fails (then the process exits
    non-zero and the client reports the death to every open stream)."""
    os.environ.update(dict(spec.env))
    import zmq

    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-core[%(process)d] %(levelname)s %(message)s")
    ctx = zmq.Context()
    commands = ctx.socket(zmq.PULL)
    outputs = ctx.socket(zmq.PUSH)
    commands.connect(spec.commands_address)
    outputs.connect(spec.outputs_address)
    try:
        try:
            engine = _build(spec)
        except Exception as exc:  # noqa: BLE001 - the client re-raises it where the server starts
            log.exception("engine core failed to start")
            outputs.send(ipc.encode(ipc.StartFailed(spec.epoch, f"{type(exc).__name__}: {exc}")))
            return
        runner = engine.runner
        outputs.send(
            ipc.encode(
                ipc.Ready(
                    epoch=spec.epoch,
                    pid=os.getpid(),
                    model_name=engine.model.name,
                    max_model_len=engine.max_model_len,
                    device=str(runner.device),
                    dtype=str(getattr(runner, "dtype", "float32")).removeprefix("torch."),
                    tokenizer=engine.tokenizer,
                    chat_template=getattr(engine.model, "chat_template", None),
                    stats=engine.stats(),
                )
            )
        )
        _CoreLoop(engine, spec, commands, outputs).run()
    finally:
        commands.close(linger=0)
        outputs.close(linger=1000)  # the last deltas (a Stop's aborts) still reach the client
        ctx.term()


def _build(spec: CoreSpec) -> Any:
    if spec.threads is not None and spec.config.device in ("cpu", "auto"):
        import torch

        if spec.config.device == "cpu" or not torch.cuda.is_available():
            torch.set_num_threads(spec.threads)
    if spec.engine_factory is not None:
        return spec.engine_factory(spec.config)
    from omni_gateway.engine.core.llm_engine import LLMEngine
    from omni_gateway.engine.runner.warmup import warm_up_engine

    engine = LLMEngine(spec.config)
    warm_up_engine(engine, spec.config.warmup)
    return engine


class _CoreLoop:
    def __init__(self, engine: Any, spec: CoreSpec, commands: Any, outputs: Any) -> None:
        import zmq

        self.engine = engine
        self.spec = spec
        self.commands = commands
        self.outputs = outputs
        self.poller = zmq.Poller()
        self.poller.register(commands, zmq.POLLIN)
        # Requests whose grammar compiles, in arrival order: (command, its compile, its deadline).
        self.compiling: dict[str, tuple[ipc.AddRequest, concurrent.futures.Future[Any], float]] = {}
        self.stats_at = 0.0

    def run(self) -> None:
        engine = self.engine
        while True:
            busy = engine.has_unfinished()
            timeout = 0 if busy else (5 if self.compiling else _IDLE_POLL_MS)
            if not self._take_commands(timeout):
                return
            self._add_compiled()
            if engine.has_unfinished():
                deltas = engine.step()
                engine.pop_finished()
                self._send(deltas)
            elif not busy and self._orphaned():
                log.error("the process that started this engine core is gone; exiting")
                return

    def _take_commands(self, timeout_ms: int) -> bool:
        """Apply every waiting command; False when told to stop."""
        if not self.poller.poll(timeout_ms):
            return True
        import zmq

        while True:
            try:
                frame = self.commands.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            command = ipc.decode(frame)
            if command.epoch != self.spec.epoch:
                continue  # meant for a core that died before this one started
            if isinstance(command, ipc.Stop):
                for _, future, _ in self.compiling.values():
                    future.cancel()
                self._send(self.engine.abort_all())
                self.engine.pop_finished()
                return False
            if isinstance(command, ipc.AbortRequest):
                pending = self.compiling.pop(command.request_id, None)
                if pending is not None:
                    pending[1].cancel()  # nobody waits for this compile now
                self._send(self.engine.abort(command.request_id))
                self.engine.pop_finished()
            elif isinstance(command, ipc.LoraCall):
                self._lora(command)
            elif command.params.structured_outputs is not None:
                self._compile(command)
            else:
                self._add(command)

    def _compile(self, command: ipc.AddRequest) -> None:
        try:
            grammars = self.engine.grammars
            future = grammars.submit(command.params.structured_outputs)
        except Exception as exc:  # noqa: BLE001 - add_request raises it again, as a refusal
            self._refuse(command, exc)
            return
        self.compiling[command.request_id] = (command, future, time.monotonic() + grammars.timeout_s)
        if future.done():
            self._add_compiled()

    def _add_compiled(self) -> None:
        """Add the requests whose grammar is ready, refuse those past their budget."""
        if not self.compiling:
            return
        now = time.monotonic()
        for rid, (command, future, deadline) in list(self.compiling.items()):
            if future.done():
                del self.compiling[rid]
                error = future.exception()
                if error is not None:
                    self._refuse(command, error)
                else:
                    self._add(command, future.result())
            elif now > deadline:
                del self.compiling[rid]
                future.cancel()
                self._refuse(command, self.engine.grammars.over_budget(command.params.structured_outputs))

    def _add(self, command: ipc.AddRequest, grammar: Any = None) -> None:
        try:
            self.engine.add_request(
                command.request_id,
                command.prompt,
                command.params,
                priority=command.priority,
                embed_spans=command.embed_spans,
                add_special_tokens=command.add_special_tokens,
                grammar=grammar,
            )
        except Exception as exc:  # noqa: BLE001 - validation errors belong to the caller
            self._refuse(command, exc)

    def _refuse(self, command: ipc.AddRequest, error: BaseException) -> None:
        self.outputs.send(ipc.encode(ipc.Refused(self.spec.epoch, command.request_id, error)))

    def _lora(self, command: ipc.LoraCall) -> None:
        error: BaseException | None = None
        try:
            if command.path is None:
                self.engine.unload_lora(command.name)
            else:
                self.engine.load_lora(command.name, command.path)
        except Exception as exc:  # noqa: BLE001 - a refused adapter belongs to the caller
            error = exc
        self.outputs.send(ipc.encode(ipc.LoraDone(self.spec.epoch, command.ticket, error)))

    def _send(self, deltas: list[Any]) -> None:
        now = time.monotonic()
        stats = None
        if not self.engine.has_unfinished() or now - self.stats_at >= _STATS_PERIOD_S:
            stats, self.stats_at = self.engine.stats(), now
        if deltas or stats is not None:
            self.outputs.send(ipc.encode(ipc.StepOutput.of(self.spec.epoch, deltas, stats)))

    def _orphaned(self) -> bool:
        return self.spec.parent_pid is not None and os.getppid() != self.spec.parent_pid


# ---- the parent's side: a local child process ----------------------------------------------------
class ProcessHandle:
    def __init__(self, process: Any) -> None:
        self.process = process

    def exit_reason(self) -> str | None:
        code = self.process.exitcode
        if code is None:
            return None
        if code < 0:
            import signal

            return f"engine core process {self.process.pid} was killed by {signal.Signals(-code).name}"
        return f"engine core process {self.process.pid} exited with code {code}"

    def kill(self) -> None:
        self.process.kill()

    def join(self, timeout: float) -> bool:
        self.process.join(timeout)
        return self.process.exitcode is not None


class ProcessLauncher:
    """Cores as ``multiprocessing`` spawn children on this machine (spawn, not fork: CUDA and torch's
    thread pools do not survive a fork), reached over ``ipc://`` sockets."""

    host: str | None = None

    def __init__(self, name: str = "engine-core", env: dict[str, str] | None = None) -> None:
        self.name = name
        self.env = tuple(sorted((env or {}).items()))

    def start(self, spec: CoreSpec) -> ProcessHandle:
        import dataclasses
        import multiprocessing

        from omni_gateway.engine.parallel.spawnable import check_spawnable

        check_spawnable("the engine core process")
        spec = dataclasses.replace(spec, env=spec.env + self.env)

        # Not a daemon: a core may start processes of its own (rank workers), which daemons may not.
        # An interpreter exit kills it (atexit), and a core whose parent vanished exits by itself.
        process = multiprocessing.get_context("spawn").Process(
            target=run_core, args=(spec,), name=f"{self.name}-{spec.epoch}"
        )
        process.start()
        atexit.register(_kill_if_alive, process)
        return ProcessHandle(process)

    def close(self) -> None:
        pass


def _kill_if_alive(process: Any) -> None:
    if process.exitcode is None:
        process.kill()
        process.join(5.0)
