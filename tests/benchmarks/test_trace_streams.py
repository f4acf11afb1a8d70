"""The trace summary: kernels read from a torch.profiler Chrome trace, timed from the marked run, and each
stream's busy time as the union of its kernels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks.analysis.trace_streams import TIMED_RUN, busy, kernels, summarize


def _trace() -> dict[str, object]:
    return {
        "traceEvents": [
            {"ph": "X", "name": TIMED_RUN, "cat": "user_annotation", "ts": 1000.0, "dur": 5000.0},
            {"ph": "X", "name": "gemv", "cat": "kernel", "ts": 1100.0, "dur": 200.0, "args": {"stream": 7}},
            {"ph": "X", "name": "gemv", "cat": "kernel", "ts": 1200.0, "dur": 300.0, "args": {"stream": 7}},
            {"ph": "X", "name": "dit", "cat": "kernel", "ts": 1000.0, "dur": 4000.0, "args": {"stream": 13}},
            {"ph": "X", "name": "Memcpy HtoD", "cat": "gpu_memcpy", "ts": 3000.0, "dur": 50.0, "args": {"stream": 7}},
            {"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": 1500.0, "dur": 10.0},
        ]
    }


def test_kernels_count_from_the_timed_run_and_busy_time_is_a_union() -> None:
    zero, found = kernels(_trace())
    assert zero == 1000.0
    assert [(s, a, b) for s, a, b, _ in found] == [(13, 0, 4000), (7, 100, 300), (7, 200, 500), (7, 2000, 2050)]
    stream7 = [(a, b) for s, a, b, _ in found if s == 7]
    assert busy(stream7, 0, 1000) == pytest.approx(400)  # 100-500, the overlap counted once
    assert busy(stream7, 250, 2025) == pytest.approx(275)  # clipped to the window at both ends


def test_summary_lists_the_busiest_stream_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(_trace(), f)
    summarize(path, 0, 4, 2)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.strip().startswith("ms"))
    assert header.split()[1:] == ["s13", "s7"]
    assert "stream 13: 1 kernels, busy 4.0 ms; dit 4.0 ms" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    assert rows == [["0", "100", "20"], ["2", "100", "2"]]


def test_the_benchmarks_trace_marks_its_timed_run(tmp_path: Path) -> None:
    import torch

    from benchmarks.analysis.trace_streams import device_trace

    path = tmp_path / "run.json.gz"
    with device_trace(path):
        torch.ones(64).add_(1)
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    marks = [e for e in trace["traceEvents"] if e.get("name") == TIMED_RUN]
    assert len(marks) == 1 and kernels(trace)[0] == marks[0]["ts"]
    assert not path.with_suffix(".json").exists()  # only the gzipped copy stays
