"""Which CUDA streams ran kernels when, from a torch.profiler trace (``device_trace``, ``omni_speech --trace FILE``).

The step timeline says when each engine step was launched and when the device reached it; this says what
else the device ran meanwhile. Per stream: its kernels' busy time in each bin of a window, and the kernels
that took most of it, so a stall of the engines' stream can be laid beside token2wav's streams.

    python -m benchmarks.analysis.trace_streams FILE [--from-ms 0] [--to-ms 500] [--bin-ms 10]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TIMED_RUN = "omni_speech timed run"  # the host range omni_speech marks its traced run with


@contextlib.contextmanager
def device_trace(path: Path | None) -> Iterator[None]:
    """Profile the body's host calls and every stream's kernels into ``path`` (gzipped Chrome trace JSON),
    marking the body as ``TIMED_RUN`` so the trace's clock can be read from its start; None: no trace."""
    if path is None:
        yield
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        with record_function(TIMED_RUN):
            yield
    raw = path.with_suffix(".json")
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    print(f"trace of the timed run: {path}")


def kernels(trace: dict[str, Any]) -> tuple[float, list[tuple[int, float, float, str]]]:
    """The timed run's start (us, the trace's clock) and every kernel and copy as (stream, start, end, name)."""
    events = trace.get("traceEvents", [])
    starts = [e["ts"] for e in events if e.get("name") == TIMED_RUN and e.get("ph") == "X"]
    zero = min(starts) if starts else min((e["ts"] for e in events if "ts" in e), default=0.0)
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            stream = int(e.get("args", {}).get("stream", -1))
            out.append((stream, e["ts"] - zero, e["ts"] - zero + e.get("dur", 0.0), e.get("name", "?")))
    return zero, sorted(out, key=lambda k: k[1])


def busy(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Microseconds of [lo, hi) covered by the union of ``intervals`` (sorted by start)."""
    total, reach = 0.0, lo
    for start, end in intervals:
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def summarize(path: Path, from_ms: float, to_ms: float, bin_ms: float) -> None:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    _, found = kernels(trace)
    lo, hi = from_ms * 1e3, to_ms * 1e3
    by_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    names: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for stream, start, end, name in found:
        if end > lo and start < hi:
            by_stream[stream].append((start, end))
            names[stream][name] += min(end, hi) - max(start, lo)
    streams = sorted(by_stream, key=lambda s: -busy(by_stream[s], lo, hi))
    print(f"{len(found)} kernels and copies; {from_ms:.0f}-{to_ms:.0f} ms, busy % per {bin_ms:.0f} ms bin:")
    print("  ms     " + " ".join(f"{'s' + str(s):>6}" for s in streams))
    edge = lo
    while edge < hi:
        step = min(bin_ms * 1e3, hi - edge)
        cells = [f"{100 * busy(by_stream[s], edge, edge + step) / step:6.0f}" for s in streams]
        print(f"  {edge / 1e3:6.0f} " + " ".join(cells))
        edge += step
    for s in streams:
        top = sorted(names[s].items(), key=lambda kv: -kv[1])[:3]
        spent = ", ".join(f"{name[:60]} {us / 1e3:.1f} ms" for name, us in top)
        print(f"  stream {s}: {len(by_stream[s])} kernels, busy {busy(by_stream[s], lo, hi) / 1e3:.1f} ms; {spent}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    parser.add_argument("--from-ms", type=float, default=0.0)
    parser.add_argument("--to-ms", type=float, default=500.0)
    parser.add_argument("--bin-ms", type=float, default=10.0)
    args = parser.parse_args()
    summarize(args.file, args.from_ms, args.to_ms, args.bin_ms)


if __name__ == "__main__":
    main()
