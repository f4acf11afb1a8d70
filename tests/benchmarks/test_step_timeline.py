"""The speaking benchmark's step timeline: host launch time per step, and device marks on a GPU."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from benchmarks.analysis.step_timeline import Timeline


class _FakeEvent:
    """A CUDA timing event that completes when recorded, on the host clock."""

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, other: _FakeEvent) -> float:
        return (other.at - self.at) * 1e3


def _engine(launch_s: float) -> Any:
    """An engine whose runner takes ``launch_s`` to launch each step of two sequences, one of them prefilling."""

    def execute(batch: Any, after: Any = None) -> Any:
        time.sleep(launch_s)
        return batch

    runner = SimpleNamespace(execute=execute)
    engine = SimpleNamespace(runner=runner)
    engine.step = lambda: [runner.execute(SimpleNamespace(num_new_tokens=[1, 5]))]
    return engine


@pytest.mark.parametrize("gpu", [False, True])
def test_steps_carry_their_launch_time_and_on_a_gpu_device_marks(
    gpu: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    if gpu:
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    timeline = Timeline()
    engine = _engine(0.02)
    timeline.watch_engine("talker", engine)
    engine.step()  # a warm-up step: not recorded
    for concurrency in (2, 4):  # each run has its own zero
        timeline.begin(concurrency)
        time.sleep(0.01)
        engine.step()
        timeline.end()
    path = tmp_path / "timeline.jsonl"
    timeline.write(path)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["c"] for e in events] == [2, 4]
    for event in events:
        (batch,) = event["batches"]
        assert (batch["seqs"], batch["tokens"], batch["prefills"]) == (2, 6, 1)
        assert 15 <= batch["launch_ms"] <= event["t1"] * 1e3 - event["t0"] * 1e3 + 1
        if gpu:
            start, end = batch["device_s"]
            # On the run's clock: the step began after the 10 ms pause, its marks bracket its launch.
            assert 0.009 <= start < end and end - start >= 0.015
            assert event["t0"] - 0.002 <= start <= event["t0"] + 0.01
        else:
            assert "device_s" not in batch


def test_stalled_launches_are_sampled_with_the_line_they_wait_on(tmp_path: Path) -> None:
    def slow_upload() -> None:
        time.sleep(0.06)

    def execute(batch: Any, after: Any = None) -> Any:
        time.sleep(0.005)  # quick: under the threshold on its own
        if batch.num_new_tokens[0] > 1:
            slow_upload()
        return batch

    runner = SimpleNamespace(execute=execute)
    engine = SimpleNamespace(runner=runner, step=lambda: [])
    timeline = Timeline()
    timeline.watch_engine("thinker", engine)
    timeline.watch_stalls(after_ms=20, every_ms=2)
    timeline.begin(4)
    for n in (1, 7, 1):
        runner.execute(SimpleNamespace(num_new_tokens=[n]))
    timeline.end()
    timeline.stop_stalls()
    path = tmp_path / "timeline.jsonl"
    timeline.write(path)
    stalls = [e for e in map(json.loads, path.read_text().splitlines()) if e["what"] == "stall"]
    assert stalls and all(e["c"] == 4 and e["engine"] == "thinker" for e in stalls)
    # Sampled only past 20 ms of the 65 ms launch: about 20 samples, all inside the slow upload.
    assert 5 <= sum(e["samples"] for e in stalls) <= 30
    assert all(e["stack"][0].endswith("slow_upload") for e in stalls)
    # The sampler's own probes, every 2 ms of the run: some taken during the stall, some outside it; off the
    # GPU no driver call is timed. Its wake-up lateness is a sleep's overshoot here: never negative.
    probes = [e for e in map(json.loads, path.read_text().splitlines()) if e["what"] == "probe"]
    assert {e["stalled"] for e in probes} == {True, False}
    assert 5 <= sum(e["stalled"] for e in probes) <= 30
    assert all(e["late_ms"] >= 0 and e["driver_ms"] is None and e["c"] == 4 for e in probes)
