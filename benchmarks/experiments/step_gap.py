"""What do the copies staged around a CUDA-graph replay cost a pipelined decode loop?

    python -m benchmarks.experiments.step_gap            # N_KERNELS=1200 for a longer graph

A graph of ``N_KERNELS`` small elementwise kernels stands in for a decode step. The host loop
launches step i+1 before waiting for step i, as pipelined decode does, and each pattern adds the
copies the engine stages per step: a host-to-device copy of the packed rows (``h2d``) and of the
block tables (``2h2d``), a device-to-device copy of the previous tokens (``d2d``) and the
device-to-host copy of the sampled tokens (``d2h``). Prints microseconds per step; "graph only"
is the baseline.

Answer (one H200, 2026-12-03 09:10 UTC, the script's first draft, 400 kernels, 300 steps): about 23 us
a step. Graph only 752.5 us; with the rows copied to the device 763.0-763.4; with the block tables
too 768.5-768.6; with the previous tokens device to device 770.3-770.4; with the tokens to the host
775.4-775.7. So the 0.16 ms a pipelined 8B step then spent outside its graph was not these copies:
a later CUDA-event probe (``benchmarks.engine_gpu --probe-b1``) showed it was the graph itself,
whose time varies by up to 3% between machines.
"""

import argparse
import os
import time

import torch

dev = torch.device("cuda")
N_KERNELS = int(os.environ.get("N_KERNELS", "400"))
STEPS = 300


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    x = torch.randn(4096, device=dev)
    rows_dev = torch.zeros(256, 4, dtype=torch.int64, device=dev)
    tables_dev = torch.zeros(256, 128, dtype=torch.int32, device=dev)
    prev = torch.zeros(256, dtype=torch.int64, device=dev)
    out = torch.zeros(256, dtype=torch.int64, device=dev)
    pinned_rows = [torch.zeros(256, 4, dtype=torch.int64, pin_memory=True) for _ in range(2)]
    pinned_tables = [torch.zeros(256, 128, dtype=torch.int32, pin_memory=True) for _ in range(2)]
    pinned_tok = [torch.zeros(256, dtype=torch.int64, pin_memory=True) for _ in range(2)]

    def body():
        y = x
        for _ in range(N_KERNELS):
            y = y * 1.0001 + 0.5
        out[:1].copy_((y[:1] + rows_dev[:1, 0] + prev[:1]).long())

    for _ in range(2):
        body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    g.replay()
    torch.cuda.synchronize()

    def run(pattern: str) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pending = None
        for i in range(STEPS):
            s = i % 2
            if "h2d" in pattern:
                rows_dev.copy_(pinned_rows[s], non_blocking=True)
                if "2h2d" in pattern:
                    tables_dev.copy_(pinned_tables[s], non_blocking=True)
            if "d2d" in pattern:
                prev[:1].copy_(out[:1], non_blocking=True)
            g.replay()
            if "d2h" in pattern:
                pinned_tok[s][:1].copy_(out[:1], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            if pending is not None:
                pending.synchronize()
            pending = ev
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / STEPS * 1e6

    patterns = ["graph only", "h2d", "2h2d", "2h2d d2d", "2h2d d2d d2h", "h2d d2h", "d2h"]
    for p in patterns:
        run(p)
    for _rep in range(2):
        for p in patterns:
            print(f"{N_KERNELS} kernels, {p:16s}: {run(p):8.1f} us/step", flush=True)


if __name__ == "__main__":
    main()
