"""Rank 0 of tensor parallel: the engine's own process spawns the other ranks and drives them.

The scheduler and the sampler live here only. Each step, rank 0 pickles the step once (plain
lists of ints, or the staged inputs of a decode graph) and sends the bytes down one pipe per
worker; the token ids of a step launched ahead stay on the device and follow over the device group.
Then every rank runs the same forward on its shard; the collectives inside it line the ranks up.

A worker that dies is noticed before the next step (its process sentinel) or inside a collective
(gloo sees the socket close; NCCL after ``COLLECTIVE_TIMEOUT``), and the step raises
``TensorParallelError`` naming the rank, its exit code and its last error.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import pickle
import socket
import threading
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any

import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.sequence import ScheduledBatch
from omni_gateway.engine.parallel.context import ParallelContext
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.parallel.spawnable import check_spawnable
from omni_gateway.engine.parallel.worker import STOP, join_group, worker_main
from omni_gateway.engine.runner.device_dtype import pick_device_dtype
from omni_gateway.engine.runner.loader import LoadedModel
from omni_gateway.engine.runner.model_runner import ModelRunner
from omni_gateway.engine.runner.pending_decode import PendingDecode
from omni_gateway.engine.runner.step_plan import StepPlan

log = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 10.0  # how long a stopped worker may take to exit before it is killed
_EXIT_GRACE_S = 5.0  # how long a failed collective waits for the rank that broke it to exit


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank failed or exited; the engine cannot run further steps."""


class _Workers:
    """The spawned ranks 1..N-1, their pipes, and rank 0's membership of the process group."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel, device: torch.device) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            raise TensorParallelError(
                "a torch.distributed process group already exists in this process; "
                "one tensor-parallel engine per process (shut the other one down first)"
            )
        n = config.tensor_parallel_size
        check_spawnable(f"tensor_parallel_size {n}")
        self.world_size = n
        self.base_index = (device.index or 0) if device.type == "cuda" else 0
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        # Workers need neither the tokenizer nor the chat template; the weights they read themselves.
        shipped = dataclasses.replace(loaded, tokenizer=None, chat_template=None, weights={})
        spawn = multiprocessing.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.errors: dict[int, str] = {}
        self.closed = False
        self.joined = False
        self.steps_sent = 0
        for rank in range(1, n):
            ours, theirs = spawn.Pipe()
            proc = spawn.Process(
                target=worker_main,
                args=(rank, n, init_method, device.type, self.base_index, config, shipped, theirs),
                name=f"omni-tp-rank{rank}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        try:
            self.context = self._join(init_method, device.type, config.enable_expert_parallel)
        except BaseException:
            self.shutdown()  # the ranks that did start must not wait for a group that will never form
            raise

    def _join(self, init_method: str, device_type: str, expert_parallel: bool) -> ParallelContext:
        """Join the group from a thread, so a worker that dies before it joins fails fast here."""
        box: dict[str, Any] = {}

        def join() -> None:
            try:
                box["ctx"] = join_group(0, self.world_size, init_method, device_type, self.base_index, expert_parallel)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = exc

        thread = threading.Thread(target=join, name="omni-tp-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
            self.check_alive()
        if "error" in box:
            raise TensorParallelError(f"rank 0 could not join the tensor-parallel group: {box['error']}")
        self.joined = True
        ctx: ParallelContext = box["ctx"]
        if ctx.device is not None and ctx.device.type == "cuda":
            torch.cuda.set_device(ctx.device)  # the current device is per thread: the join ran in another
        return ctx

    def wait_ready(self) -> None:
        for rank, conn in enumerate(self.conns, start=1):
            while not conn.poll(0.2):
                self.check_alive()
            kind, detail = conn.recv()
            if kind != "ready":
                self.errors[rank] = str(detail)
                raise TensorParallelError(f"tensor-parallel rank {rank} failed to start:\n{detail}")

    def check_alive(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            if not proc.is_alive():
                raise TensorParallelError(self.describe_death(rank))

    def describe_death(self, rank: int) -> str:
        proc = self.procs[rank - 1]
        self._collect_error(rank)
        state = "is running" if proc.is_alive() else f"exited with code {proc.exitcode}"
        last = self.errors.get(rank)
        return f"tensor-parallel rank {rank} (pid {proc.pid}) {state}" + (f"; its error:\n{last}" if last else "")

    def _collect_error(self, rank: int) -> None:
        conn = self.conns[rank - 1]
        try:
            while conn.poll(0):
                kind, detail = conn.recv()
                if kind == "error":
                    self.errors[rank] = str(detail)
        except (EOFError, OSError):
            pass

    def explain(self, exc: BaseException) -> TensorParallelError:
        """A collective failed: name the rank that went away, if one did."""
        deadline = time.monotonic() + _EXIT_GRACE_S
        for rank in range(1, self.world_size):
            proc = self.procs[rank - 1]
            proc.join(max(0.0, deadline - time.monotonic()))  # its exit may lag the socket it closed
            self._collect_error(rank)
            if not proc.is_alive() or rank in self.errors:
                return TensorParallelError(f"{self.describe_death(rank)}\n(rank 0 saw: {exc})")
        return TensorParallelError(f"tensor parallel failed on rank 0: {type(exc).__name__}: {exc}")

    def send(self, kind: str, body: object, ids: torch.Tensor | None) -> None:
        if self.closed:
            raise TensorParallelError("the tensor-parallel workers were shut down")
        self.check_alive()
        if isinstance(body, StepPlan) and body.embeds is not None:  # a device tensor would unpickle on rank 0's device
            body = dataclasses.replace(body, embeds=body.embeds.cpu())
        if isinstance(body, StepPlan) and body.deepstack is not None:
            body = dataclasses.replace(body, deepstack=body.deepstack.cpu())
        payload = pickle.dumps((kind, body, 0 if ids is None else ids.numel()), protocol=pickle.HIGHEST_PROTOCOL)
        self.steps_sent += 1
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send_bytes(payload)
            except OSError as exc:
                raise TensorParallelError(f"{self.describe_death(rank)} (send failed: {exc})") from exc
        if ids is not None:
            import torch.distributed as dist

            dist.broadcast(ids.contiguous(), src=0, group=self.context.group)

    def shutdown(self) -> None:
        """Stop every worker (killing one that does not exit in time) and leave the process group."""
        if self.closed:
            return
        self.closed = True
        stop = pickle.dumps((STOP, None, 0))
        for conn in self.conns:
            try:
                conn.send_bytes(stop)
            except OSError:
                pass
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("tensor-parallel worker %s did not stop; killing it", proc.name)
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        if self.joined:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


class TensorParallelRunner(ModelRunner):
    """Rank 0's ``ModelRunner``: the engine drives it like any runner; the other ranks follow."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel) -> None:
        n = config.tensor_parallel_size
        device = pick_device_dtype(config)[0]
        if device.type == "cuda":
            base = device.index or 0
            count = torch.cuda.device_count()
            if base + n > count:
                raise ValueError(
                    f"tensor_parallel_size={n} from cuda:{base} needs {base + n} CUDA devices, found {count}"
                )
        # A model that cannot be split fails before anything starts.
        ShardLayout.of(loaded.hf_config, 0, n, config.enable_expert_parallel)
        if loaded.source is None:
            raise ValueError("tensor parallel needs a model loaded with tensor_parallel_size > 1 (no weight source)")
        self._workers = _Workers(config, loaded, device)
        self._finalizer = weakref.finalize(self, self._workers.shutdown)
        try:
            super().__init__(config, loaded, self._workers.context, broadcast=self._workers.send)
            self._workers.wait_ready()
        except TensorParallelError:
            self._finalizer()
            raise
        except Exception as exc:
            error = self._workers.explain(exc)
            self._finalizer()
            raise error from exc
        log.info("tensor parallel: %d ranks on %s", n, self.device.type)

    def execute(self, batch: ScheduledBatch, after: PendingDecode | None = None) -> PendingDecode:
        sent = self._workers.steps_sent
        try:
            return super().execute(batch, after)
        except Exception as exc:
            if self._workers.steps_sent == sent and not isinstance(exc, TensorParallelError):
                raise  # refused before any rank saw the step (a malformed batch): the ranks stay in step
            # The ranks may be inside this step's collectives, which rank 0 will never join: stop them all.
            error = exc if isinstance(exc, TensorParallelError) else self._workers.explain(exc)
            self._finalizer()
            raise error from exc

    def shutdown(self) -> None:
        self._finalizer()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
