"""Engine cores as Ray actors (``--distributed-executor-backend ray``), for replicas across machines.

Ray places and supervises; it does not carry tokens. Each replica owns one placement group of one
bundle (``tensor_parallel_size`` GPUs and a CPU, or CPUs only), ``STRICT_PACK``: everything a replica
holds sits on one node, where its tensor-parallel ranks talk over NVLink/PCIe rather than the network.
The actor runs ``core_process.run_core`` and speaks the same ZeroMQ messages as a local core, over TCP
to the gateway node. A replica's death is the actor's: its ``run`` call resolves with an error, which
the client sees on its next look (every 100 ms); the restart is a new actor in the same placement group.

Ray is an optional extra (``pip install 'omni-gateway[ray]'``).
"""

from __future__ import annotations

import logging
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.frontend.core_process import CoreSpec, run_core

log = logging.getLogger(__name__)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError("--distributed-executor-backend ray needs Ray: pip install 'omni-gateway[ray]'") from None
    if not ray.is_initialized():
        # Joins the cluster of RAY_ADDRESS or of a `ray start` on this machine, else starts a local one.
        ray.init()
    return ray


class EngineCoreActor:
    """The body of one replica: ``run`` serves until the core stops."""

    def run(self, spec: CoreSpec) -> None:
        run_core(spec)

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


class RayHandle:
    def __init__(self, ray: Any, actor: Any, done: Any) -> None:
        self.ray = ray
        self.actor = actor
        self.done = done  # the ObjectRef of ``run``: resolves when the core ends, with an error if it died

    def exit_reason(self) -> str | None:
        finished, _ = self.ray.wait([self.done], timeout=0)
        if not finished:
            return None
        try:
            self.ray.get(self.done)
        except Exception as exc:  # noqa: BLE001 - the actor's death, as Ray words it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"engine core actor died: {type(exc).__name__}: {first}"
        return "engine core actor exited"

    def kill(self) -> None:
        self.ray.kill(self.actor, no_restart=True)

    def join(self, timeout: float) -> bool:
        finished, _ = self.ray.wait([self.done], timeout=timeout)
        return bool(finished)


class RayLauncher:
    """Starts one replica's cores as actors in that replica's placement group."""

    def __init__(self, config: EngineConfig, name: str = "omni-engine") -> None:
        from ray.util.placement_group import placement_group

        ray = _ray()
        self.ray = ray
        self.name = name
        self.host: str | None = ray.util.get_node_ip_address()  # where the actors reach the gateway
        self.gpus = getattr(config, "tensor_parallel_size", 1) if _wants_gpu(config) else 0
        bundle: dict[str, float] = {"CPU": 1.0}
        if self.gpus:
            bundle["GPU"] = float(self.gpus)
        self.group = placement_group([bundle], strategy="STRICT_PACK", name=f"{name}-group")
        ready, _ = ray.wait([self.group.ready()], timeout=600)
        if not ready:
            ray.util.remove_placement_group(self.group)
            raise RuntimeError(
                f"Ray could not place replica {name!r}: no node offers {bundle} (ray status shows the cluster)"
            )

    def start(self, spec: CoreSpec) -> RayHandle:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_class = self.ray.remote(EngineCoreActor)
        actor = actor_class.options(
            name=f"{self.name}-{spec.epoch}",
            num_cpus=1,
            num_gpus=self.gpus,
            max_restarts=0,  # the client restarts, so it knows which epoch is current
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=0),
        ).remote()
        return RayHandle(self.ray, actor, actor.run.remote(spec))

    def close(self) -> None:
        self.ray.util.remove_placement_group(self.group)


def _wants_gpu(config: EngineConfig) -> bool:
    return config.device.startswith("cuda") or (config.device == "auto" and _cluster_has_gpus())


def _cluster_has_gpus() -> bool:
    import ray

    return bool(ray.cluster_resources().get("GPU", 0))
