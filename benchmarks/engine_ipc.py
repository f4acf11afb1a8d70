"""What running the engine core in its own process costs: the same streams through ``AsyncEngine`` (the
core in a thread of this process) and through ``EngineCoreClient`` (the core in a spawned process, over
ZeroMQ with pickled messages).

    python -m benchmarks.engine_ipc [--models tiny,default] [--tokens 128] [--streams 1,8] [--out FILE]

For each model and stream count: decode tokens/s over all streams, and the mean time between two deltas
of one stream (one engine step); the difference between the layouts is the per-step cost of the IPC.
Also the encode + decode time of one step's message at each batch size, without any engine. Each layout
runs once as a warm-up first (prefix cache off, so no run is served from the cache of the one before).
Raw results go to ``benchmarks/results/engine_ipc.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.frontend import ipc
from omni_gateway.engine.frontend.launch import start_engine
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams

from benchmarks.lib.common import ResultLog, add_out_argument, machine_info


def engine_config(model: str, directory: Path, *, in_process: bool) -> EngineConfig:
    if model == "tiny":
        from tests.harness.checkpoints import save_tiny_checkpoint

        save_tiny_checkpoint("llama", directory)
        model = str(directory)
    return EngineConfig(
        model=model,
        device="cpu",
        dtype="float32",
        warmup="minimal",
        enable_prefix_caching=False,
        engine_in_process=in_process,
    )


async def run_streams(engine: Any, streams: int, tokens: int) -> tuple[float, list[float]]:
    """Decode tokens/s over all streams, and the gaps between consecutive deltas of each stream."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    gaps: list[float] = []

    async def one(k: int) -> int:
        count, last = 0, None
        async for delta in engine.generate(f"Stream {k}: count slowly from one to a hundred.", params):
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
            count += len(delta.token_ids)
        return count

    t0 = time.perf_counter()
    total = sum(await asyncio.gather(*(one(k) for k in range(streams))))
    return total / (time.perf_counter() - t0), gaps


def message_cost(batch: int, repeats: int = 2000) -> float:
    """Seconds to pickle and unpickle one step's output (back to ``StreamDelta``s) at this batch size."""
    deltas = tuple(
        StreamDelta(f"req-{i:032x}", " word", (1234,), num_prompt_tokens=40, num_output_tokens=9) for i in range(batch)
    )
    message = ipc.StepOutput.of(1, list(deltas), None)
    t0 = time.perf_counter()
    for _ in range(repeats):
        ipc.decode(ipc.encode(message)).deltas()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,default", help="'tiny' (random 2-layer Llama) and/or a model")
    parser.add_argument("--tokens", type=int, default=128, help="tokens each stream decodes")
    parser.add_argument("--streams", default="1,8", help="concurrent streams, comma-separated")
    add_out_argument(parser, "engine_ipc")
    args = parser.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    with ResultLog(args.out, "engine_ipc", machine=machine_info(), tokens=args.tokens) as results:
        for batch in (1, 8, 64):
            cost = message_cost(batch)
            results.write("message", batch=batch, encode_decode_us=cost * 1e6)
            print(f"step message, {batch:3d} deltas: pickle + unpickle {cost * 1e6:.1f} us")
        for model in args.models.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                for in_process in (True, False):
                    layout = "thread" if in_process else "process"
                    engine = start_engine(engine_config(model, Path(tmp), in_process=in_process), threads=1)
                    try:
                        asyncio.run(run_streams(engine, 1, 8))  # first-call costs
                        for streams in counts:
                            rate, gaps = asyncio.run(run_streams(engine, streams, args.tokens))
                            step_ms = statistics.mean(gaps) * 1e3
                            results.write(
                                "stream",
                                model=model,
                                layout=layout,
                                streams=streams,
                                tokens_per_s=rate,
                                step_ms=step_ms,
                            )
                            print(
                                f"{model:8s} {layout:7s} {streams:2d} streams: {rate:8.1f} tok/s, "
                                f"{step_ms:6.2f} ms between deltas"
                            )
                    finally:
                        engine.shutdown()


if __name__ == "__main__":
    main()
