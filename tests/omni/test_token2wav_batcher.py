"""``BatchedCalls`` picks what runs next by each job's playback deadline (a fake batch function, no torch)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from omni_gateway.omni.heads.token2wav import batcher as batcher_module
from omni_gateway.omni.heads.token2wav.batcher import BatchedCalls


class Held:
    """A batcher whose first call holds its only lane until ``release``: whatever is queued meanwhile is
    ordered by the batcher alone. ``batches`` records each call's jobs."""

    def __init__(self, **options: Any) -> None:
        self.gate, self.busy = threading.Event(), threading.Event()
        self.batches: list[list[str]] = []
        self.calls = BatchedCalls(self._fn, "test-deadlines", **options)
        self.threads: list[threading.Thread] = []
        self._submit("hold", "busy", {})
        assert self.busy.wait(5)

    def _fn(self, jobs: list[tuple[Any, ...]], lane: int) -> list[str]:
        self.busy.set()
        self.gate.wait(5)
        self.batches.append([job for (job,) in jobs])
        return [job.upper() for (job,) in jobs]

    def _submit(self, key: str, job: str, options: dict[str, Any]) -> None:
        def call() -> None:
            assert self.calls(key, job, **options) == job.upper()

        self.threads.append(threading.Thread(target=call))
        self.threads[-1].start()

    def queue(self, key: str, job: str, **options: Any) -> None:
        """Queue one job, after every job queued before it."""
        waiting = self.calls.queued
        self._submit(key, job, options)
        deadline = time.monotonic() + 5
        while self.calls.queued <= waiting:
            assert time.monotonic() < deadline, "the job never queued"
            time.sleep(0.001)

    def release(self) -> list[list[str]]:
        self.gate.set()
        for thread in self.threads:
            thread.join(5)
        self.calls.close()
        assert self.batches[0] == ["busy"]
        return self.batches[1:]  # the holding call is not what the tests order


@pytest.fixture
def now() -> float:
    return time.monotonic()


def test_the_group_due_soonest_runs_first_whatever_arrived_first(now: float) -> None:
    held = Held()
    held.queue("a", "a-late", deadline=now + 3.0)
    held.queue("b", "b-soon", deadline=now + 0.2)
    held.queue("c", "c-mid", deadline=now + 1.0)
    held.queue("a", "a-soonest", deadline=now + 0.1)  # its group's earliest deadline is now the soonest
    assert held.release() == [["a-soonest", "a-late"], ["b-soon"], ["c-mid"]]


def test_a_group_larger_than_max_batch_is_cut_earliest_deadlines_first(now: float) -> None:
    held = Held(max_batch=2)
    for job, due in (("j3", 3.0), ("j1", 1.0), ("j4", 4.0), ("j2", 2.0), ("j0", 0.5)):
        held.queue("k", job, deadline=now + due)
    assert held.release() == [["j0", "j1"], ["j2", "j3"], ["j4"]]


def test_first_chunks_go_before_any_deadline(now: float) -> None:
    held = Held(max_batch=2)
    held.queue("later", "overdue", deadline=now - 5.0)  # a listener already out of audio
    held.queue("first", "f1", urgent=True, deadline=now)
    held.queue("mixed", "m-later", deadline=now - 10.0)
    held.queue("mixed", "m-first", urgent=True, deadline=now)
    # urgent groups first (the one holding the earliest job before the other); in a group, first chunks first
    assert held.release() == [["m-first", "m-later"], ["f1"], ["overdue"]]


def test_jobs_without_a_deadline_are_due_a_fixed_slack_after_they_arrived(
    now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batcher_module, "NO_DEADLINE_SLACK_S", 0.5)
    held = Held()
    held.queue("plain", "p1")
    held.queue("plain2", "p2")
    held.queue("far", "far", deadline=now + 60.0)  # plenty buffered: the deadline-less jobs are due sooner
    held.queue("near", "near", deadline=now + 0.1)  # about to run dry: before them
    held.queue("plain3", "p3")
    assert held.release() == [["near"], ["p1"], ["p2"], ["p3"], ["far"]]


def test_a_stream_about_to_run_dry_overtakes_streams_with_audio_buffered(now: float) -> None:
    """Many streams' later chunks are queued under one key (one shape); the stream with 50 ms left is in the
    first call, however late it arrived, and the streams with seconds buffered wait for the next."""
    held = Held(max_batch=4)
    for n in range(8):
        held.queue("chunk", f"buffered{n}", deadline=now + 3.0 + n * 0.01)
    held.queue("chunk", "dry", deadline=now + 0.05)
    batches = held.release()
    assert batches[0] == ["dry", "buffered0", "buffered1", "buffered2"]
    assert batches[1:] == [["buffered3", "buffered4", "buffered5", "buffered6"], ["buffered7"]]


def test_the_first_chunk_lane_takes_only_the_first_chunks_of_a_mixed_group(now: float) -> None:
    """Two lanes, the later-chunk lane held: lane 0 runs a group's first chunk and leaves its later chunk."""
    ran: list[tuple[list[str], int]] = []
    gate = threading.Event()

    def fn(jobs: list[tuple[Any, ...]], lane: int) -> list[str]:
        names = [job for (job,) in jobs]
        ran.append((names, lane))
        if names == ["hold"]:
            gate.wait(5)
        return names

    calls = BatchedCalls(fn, "test-lanes", lanes=2)
    holding = threading.Thread(target=calls, args=("hold", "hold"))
    holding.start()
    deadline = time.monotonic() + 5
    while not ran:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    later = threading.Thread(target=calls, args=("k", "later"), kwargs={"deadline": now - 1.0})
    later.start()
    while calls.queued < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert calls("k", "first", urgent=True, deadline=now) == "first"
    assert calls.queued == 1  # the later chunk waits for the later-chunk lane
    gate.set()
    for thread in (holding, later):
        thread.join(5)
    calls.close()
    assert ran == [(["hold"], 1), (["first"], 0), (["later"], 1)]
