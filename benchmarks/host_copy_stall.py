"""How long one thread's kernel launches wait while another thread copies device results to the host.

    python -m benchmarks.host_copy_stall [--seconds 4] [--out FILE]

A "heavy" thread replays a CUDA graph of large matrix products (a token2wav call stands in) on a stream
of its own and then copies a result to the host; a "light" thread on another stream launches 20 small
kernels and records an event every millisecond, timing each launch on the host. The heavy thread's copy
is made three ways: into pageable memory (``tensor.cpu()``), into pinned memory through
``kernels.host_copies.to_host``, and not at all (a stream synchronization only, the floor). Printed: the
light thread's launch time (median, p99) per way and each against the floor; a pageable copy holds every
other thread's launches until the heavy stream's work is done.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

from benchmarks.lib.common import ResultLog, add_out_argument, percentile, ratio

WAYS = ("pageable", "pinned", "none")


def measure(way: str, seconds: float) -> dict[str, float]:
    import torch
    from omni_gateway.kernels.host_copies import to_host

    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    result = torch.randn(32, 48000, device=device)
    heavy_stream, light_stream = torch.cuda.Stream(), torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(heavy_stream):
        (a @ a).sum().item()  # cuBLAS set up outside the capture
        with torch.cuda.graph(graph, stream=heavy_stream):
            b = a
            for _ in range(60):
                b = (b @ a) * 1e-3
    copy: Callable[[torch.Tensor], object] = {
        "pageable": lambda t: t.cpu(),
        "pinned": lambda t: to_host(t),
        "none": lambda t: heavy_stream.synchronize(),
    }[way]
    stop = threading.Event()

    def heavy() -> None:
        with torch.cuda.stream(heavy_stream):
            while not stop.is_set():
                graph.replay()
                copy(result * 2)

    launches: list[float] = []

    def light() -> None:
        x = torch.ones(1024, device=device)
        with torch.cuda.stream(light_stream):
            while not stop.is_set():
                began = time.perf_counter()
                for _ in range(20):
                    x = x * 1.0001
                done = torch.cuda.Event()
                done.record()
                launches.append((time.perf_counter() - began) * 1e3)
                done.synchronize()
                time.sleep(0.001)

    threads = [threading.Thread(target=heavy), threading.Thread(target=light)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    kept = launches[len(launches) // 10 :] or launches  # the first ones overlap the threads' start
    return {"launches": len(kept), "median_ms": percentile(kept, 0.5), "p99_ms": percentile(kept, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="how long each way runs")
    add_out_argument(parser, "host_copy_stall")
    args = parser.parse_args()
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    rows = {way: measure(way, args.seconds) for way in WAYS}
    floor = rows["none"]
    with ResultLog(args.out, "host_copy_stall", seconds=args.seconds) as log:
        for way, row in rows.items():
            log.write("way_result", way=way, **row)
            print(
                f"{way:8s}: {row['launches']:5d} launches, median {row['median_ms']:.3f} ms "
                f"({ratio(row['median_ms'], floor['median_ms'])} of no copy), p99 {row['p99_ms']:.3f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
