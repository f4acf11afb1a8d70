"""A tensor-parallel rank other than 0: a spawned process that holds its shard and runs the steps
rank 0 sends it, in order, until told to stop or until rank 0 goes away."""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.parallel.context import ParallelContext

# A collective that waits longer than this fails instead of hanging (a peer that stopped answering).
COLLECTIVE_TIMEOUT = timedelta(seconds=300)

# Messages from rank 0: (kind, body, number of device token ids that follow over the device group).
EAGER, GRAPH, STOP = "eager", "graph", "stop"


def join_group(
    rank: int, world_size: int, init_method: str, device_type: str, base_index: int, expert_parallel: bool = False
) -> ParallelContext:
    """Join the process group (NCCL on CUDA, gloo on the CPU) and return this rank's context."""
    import torch.distributed as dist

    device = torch.device("cuda", base_index + rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    control = dist.new_group(backend="gloo") if device.type == "cuda" else dist.group.WORLD
    return ParallelContext(rank, world_size, dist.group.WORLD, control, device, expert_parallel)


def receive_ids(ctx: ParallelContext, count: int) -> torch.Tensor | None:
    """The token ids of a step launched ahead, broadcast by rank 0 from its device."""
    if count == 0:
        return None
    import torch.distributed as dist

    ids = torch.empty(count, dtype=torch.int64, device=ctx.device)
    dist.broadcast(ids, src=0, group=ctx.group)
    return ids


def worker_main(
    rank: int,
    world_size: int,
    init_method: str,
    device_type: str,
    base_index: int,
    config: EngineConfig,
    loaded: Any,
    conn: Connection,
) -> None:
    """Entry point of a spawned rank: report ``ready`` (or the error) on ``conn``, then serve steps."""
    import torch.distributed as dist
    from omni_gateway.engine.runner.model_runner import ModelRunner

    # Ctrl-C reaches the whole process group: rank 0 decides when the ranks stop (STOP, or EOF on the pipe).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if device_type == "cpu":  # the ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        ctx = join_group(rank, world_size, init_method, device_type, base_index, config.enable_expert_parallel)
        runner = ModelRunner(config, loaded, ctx)
        conn.send(("ready", None))
        with torch.inference_mode():
            while True:
                try:
                    kind, body, num_ids = pickle.loads(conn.recv_bytes())
                except EOFError:  # rank 0 is gone: nothing will come
                    break
                if kind == STOP:
                    break
                ids = receive_ids(ctx, num_ids)
                if kind == EAGER:
                    runner.run_plan(body, ids)
                elif kind == GRAPH:
                    assert runner.graphs is not None, "rank 0 replays decode graphs this rank did not capture"
                    # Pinned, so staging them into the graph's buffers does not wait for the step before.
                    inputs = {name: torch.from_numpy(array).pin_memory() for name, array in body.items()}
                    if ids is not None:
                        inputs["prev_ids"] = ids
                    runner.graphs.replay(inputs)
                else:
                    raise ValueError(f"unknown step kind {kind!r} from rank 0")
    except BaseException:  # noqa: BLE001 - whatever it was, rank 0 must learn why this rank stops
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
