"""What every benchmark shares: where raw results go and how they are written (JSON lines), the
machine a run was on, timing statistics, and CUDA-graph timing of a kernel call.

Each benchmark appends to ``benchmarks/results/<name>.jsonl`` unless ``--out`` names another file: one
``run`` record (date, command, machine, software) and then the run's measurements, each a record with
its ``kind``, all carrying the run's ``run_id`` so the lines of one run can be picked out of a file that
holds many. Records of the kinds in ``DETAIL_KINDS`` (one per turn, per request, per swept config: hundreds a
run) go to the gzipped sibling ``<name>.jsonl.gz`` instead, which keeps every file of ``benchmarks/results/``
under 1 MB; ``read_results`` reads a file and its sibling as one. A run copied from another machine brings both.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

_BENCHMARKS = Path(__file__).resolve().parent.parent
RESULTS_DIR = _BENCHMARKS / "results"

# Per benchmark, the record kinds written to the gzipped sibling: raw per-turn, per-cycle, per-request and per-config
# records, which the results page summarises from the per-run records beside them.
DETAIL_KINDS: dict[str, frozenset[str]] = {
    "cold_start": frozenset({"request"}),
    "quant_sweep": frozenset({"decode", "prefill"}),
    "soak_rss": frozenset({"cycle"}),
    "turn_decisions": frozenset({"turn"}),
    "voice_loop": frozenset({"turn"}),
    "voice_sessions": frozenset({"turn"}),
    "webrtc_latency": frozenset({"turn"}),
}
_LOGS_OPENED = itertools.count()
# Detail records held in memory before they are appended as one gzip member (members concatenate).
_DETAIL_FLUSH = 1000


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
            ["git", "rev-parse", "--short", "HEAD"], cwd=_BENCHMARKS, capture_output=True, text=True, timeout=5
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


def detail_path(path: Path) -> Path:
    """The gzipped sibling of a results file, ``NAME.jsonl.gz`` beside ``NAME.jsonl``."""
    return path.with_name(path.name + ".gz")


def read_results(path: Path) -> list[dict[str, Any]]:
    """The records of a results file and of its gzipped sibling, the plain file's first, each in written order."""
    return [*_read_lines(path), *_read_lines(detail_path(path))]


def _read_lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: expected a JSON record, got {line[:80]!r}") from exc


class ResultLog:
    """Appends a run's records to a JSON-lines file; the first line of the run describes it.

    Records of the benchmark's ``DETAIL_KINDS`` go to the gzipped sibling, appended a gzip member at a time
    (every ``_DETAIL_FLUSH`` records and on ``close``)."""

    def __init__(self, path: Path, benchmark: str, **run_fields: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.benchmark = benchmark
        self.run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"
        if (n := next(_LOGS_OPENED)) > 0:  # a second run of one process within a second stays apart
            self.run_id += f".{n}"
        self._detail_kinds = DETAIL_KINDS.get(benchmark, frozenset())
        self._detail: list[str] = []
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
        line = json.dumps(record, default=str) + "\n"
        if kind in self._detail_kinds:
            self._detail.append(line)
            if len(self._detail) >= _DETAIL_FLUSH:
                self._flush_detail()
            return
        self._file.write(line)
        self._file.flush()

    def _flush_detail(self) -> None:
        if self._detail:
            with gzip.open(detail_path(self.path), "at", encoding="utf-8") as f:
                f.writelines(self._detail)
            self._detail = []

    def close(self) -> None:
        self._flush_detail()
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
