"""What every benchmark shares: where raw results go and how they are written (JSON lines), the
machine a run was on, timing statistics, and CUDA-graph timing of a kernel call.

Each benchmark appends to ``benchmarks/results/<name>.jsonl`` unless ``--out`` names another file: one
``run`` record (date, command, machine, software) and then the run's measurements, each a record with
its ``kind``, all carrying the run's ``run_id`` so the lines of one run can be picked out of a file that
holds many.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
_ROOT = Path(__file__).resolve().parents[2]


def add_out_argument(parser: argparse.ArgumentParser, name: str) -> None:
    """``--out FILE``: the JSON-lines file the run appends to (default ``benchmarks/results/<name>.jsonl``)."""
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / f"{name}.jsonl",
        metavar="FILE",
        help=f"append the raw results to this JSON-lines file (default: benchmarks/results/{name}.jsonl)",
    )


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """The machine and software of this run; the GPU only where torch already sees one."""
    info: dict[str, Any] = {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    if hasattr(os, "getloadavg"):
        info["load"] = round(os.getloadavg()[0], 2)
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    return info


class ResultLog:
    """Appends a run's records to a JSON-lines file; the first line of the run describes it."""

    def __init__(self, path: Path, benchmark: str, **run_fields: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.benchmark = benchmark
        self.run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.write(
            "run",
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            command="python -m benchmarks." + " ".join([benchmark, *sys.argv[1:]]),
            commit=_commit(),
            **machine_info(),
            **run_fields,
        )

    def write(self, kind: str, **fields: Any) -> None:
        record = {"benchmark": self.benchmark, "run_id": self.run_id, "kind": kind, **fields}
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        print(f"raw results appended to {self.path}", flush=True)

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of ``values``."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Median, p90, minimum and maximum of ``samples`` (seconds stay seconds)."""
    return {
        "median": statistics.median(samples),
        "p90": percentile(samples, 0.9),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def ratio(value: float, baseline: float) -> str:
    """``value / baseline`` as printed beside a result, e.g. ``1.43x``."""
    return f"{value / baseline:.2f}x" if baseline else "n/a"


def rel_err(out: Any, ref: Any) -> float:
    """``|out - ref| / |ref|`` (Frobenius norms, in float64) of two tensors; NaN when ``out`` holds a NaN."""
    import torch

    if torch.isnan(out).any():
        return float("nan")
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def time_graph(fn: Callable[[int], object], n_sets: int, est_s: float, replays: int = 10) -> float:
    """Median seconds per call of ``fn(i % n_sets)``, captured back to back in one CUDA graph.

    Up to 400 calls (enough for about 2 ms of work at the ``est_s`` estimate, a multiple of ``n_sets``)
    are captured, the graph is replayed ``replays`` times, and each replay's time is divided by its
    calls: launch gaps are those of a graph, and rotating over ``n_sets`` input sets keeps repeated
    reads out of L2 when the sets together are large enough."""
    import torch

    launches = max(n_sets, min(400, math.ceil(2e-3 / max(est_s, 1e-7))))
    launches = math.ceil(launches / n_sets) * n_sets
    for i in range(n_sets):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            fn(i % n_sets)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / launches)
    del graph
    return statistics.median(times)
