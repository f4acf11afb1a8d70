"""Start the serving engine the config describes: in this process, one core process, or N replicas.

``start_engine`` is the one entry point the server uses; what it returns offers the ``AsyncEngine``
interface whatever the layout:

- ``engine_in_process``: ``AsyncEngine``, the core in a thread of this process (tests, debugging,
  profilers that want one process). No restart: a failed loop turns ``/health`` red.
- otherwise ``EngineCoreClient`` (``data_parallel_size`` 1) or ``ReplicatedEngine`` over N of them,
  each core in a local spawn child (``distributed_executor_backend="mp"``) or a Ray actor (``"ray"``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.frontend.idle_threads import sleep_idle_workers

log = logging.getLogger(__name__)


def start_engine(config: EngineConfig, *, threads: int | None = None, engine_factory: Any = None) -> Any:
    """The engine, loaded and warmed; raises ModelLoadError when a core cannot start.

    ``threads``: torch threads of each core on the CPU. ``engine_factory``: builds each core's engine from
    the config instead of ``LLMEngine`` (a module-level function; tests)."""
    sleep_idle_workers()  # the core processes inherit it, and so does this one if torch has not loaded yet
    if config.engine_in_process:
        return _in_process(config, threads, engine_factory)
    from omni_gateway.engine.frontend.core_client import EngineCoreClient
    from omni_gateway.engine.frontend.replicas import ReplicatedEngine

    size = config.data_parallel_size
    launchers = [_launcher(config, i) for i in range(size)]

    def start(index: int) -> EngineCoreClient:
        name = "engine" if size == 1 else f"engine replica {index}"
        return EngineCoreClient(config, launchers[index], threads=threads, engine_factory=engine_factory, name=name)

    if size == 1:
        return start(0)
    with concurrent.futures.ThreadPoolExecutor(size) as pool:
        futures = [pool.submit(start, i) for i in range(size)]
        concurrent.futures.wait(futures)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for future in futures:
            if future.exception() is None:
                future.result().shutdown()
        raise failed[0]  # type: ignore[misc]
    return ReplicatedEngine([f.result() for f in futures], block_size=config.block_size or 16)


def _in_process(config: EngineConfig, threads: int | None, engine_factory: Any) -> Any:
    from omni_gateway.engine.core.llm_engine import LLMEngine
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.runner.warmup import warm_up_engine

    if engine_factory is not None:
        return AsyncEngine(engine=engine_factory(config))
    if threads is not None and _on_cpu(config):
        import torch

        torch.set_num_threads(threads)  # before the engine thread starts, so it runs with this count
    llm = LLMEngine(config)
    # Before the engine thread starts: the warm-up drives the engine itself, and the server only
    # listens (and reports healthy) once this returns.
    warm_up_engine(llm, config.warmup)
    return AsyncEngine(engine=llm)


def _launcher(config: EngineConfig, index: int) -> Any:
    if config.distributed_executor_backend == "ray":
        from omni_gateway.engine.frontend.ray_backend import RayLauncher

        return RayLauncher(config, name=f"omni-engine-{index}")
    from omni_gateway.engine.frontend.core_process import ProcessLauncher

    return ProcessLauncher(name=f"omni-engine-{index}", env=_local_devices(config, index))


def _local_devices(config: EngineConfig, index: int) -> dict[str, str]:
    """The GPUs of replica ``index`` on this machine: the next ``tensor_parallel_size`` of those visible."""
    if config.data_parallel_size == 1 or config.device == "cpu":
        return {}
    per_replica = getattr(config, "tensor_parallel_size", 1)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    else:
        try:
            import torch

            ids = [str(i) for i in range(torch.cuda.device_count())]
        except ImportError:
            ids = []
    if not ids:
        return {}  # no GPU: CPU replicas share the machine's cores
    mine = ids[index * per_replica : (index + 1) * per_replica]
    if len(mine) < per_replica:
        raise ValueError(
            f"data_parallel_size {config.data_parallel_size} x tensor_parallel_size {per_replica} needs "
            f"{config.data_parallel_size * per_replica} GPUs; {len(ids)} are visible"
        )
    return {"CUDA_VISIBLE_DEVICES": ",".join(mine)}


def _on_cpu(config: EngineConfig) -> bool:
    if config.device == "auto":
        import torch

        return not torch.cuda.is_available()
    return config.device == "cpu"
