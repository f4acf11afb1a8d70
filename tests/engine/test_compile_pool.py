"""The constraint compile pool: a slow compile never holds up another, and one nobody waits for any more
gives its place up."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import pytest
from omni_gateway.engine.core.compile_pool import CompilePool

TIMEOUT = 10


class Gated:
    """``work`` that blocks on the keys in ``gates`` until they are opened, and records what ran."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.ran: list[str] = []
        self.started: dict[str, threading.Event] = {}

    def gate(self, key: str) -> threading.Event:
        self.started[key] = threading.Event()
        self.gates[key] = threading.Event()
        return self.gates[key]

    def __call__(self, key: str) -> str:
        self.ran.append(key)
        if key in self.gates:
            self.started[key].set()
            self.gates[key].wait(TIMEOUT)
        if key.startswith("bad"):
            raise ValueError(f"cannot compile {key}")
        return key.upper()


def settled(pool: CompilePool[str, str], expected: dict[str, int]) -> dict[str, int]:
    """The pool's stats once they equal ``expected`` (a worker that handed out its result may not have
    counted itself idle yet), or as they are at the timeout."""
    deadline = time.monotonic() + TIMEOUT
    while pool.stats() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return pool.stats()


def test_a_quick_compile_finishes_while_slow_ones_run() -> None:
    work = Gated()
    gates = [work.gate(f"slow{i}") for i in range(3)]
    pool: CompilePool[str, str] = CompilePool(work, workers=4)
    slow = [pool.submit(f"slow{i}") for i in range(3)]
    assert pool.submit("quick").result(TIMEOUT) == "QUICK"
    assert not any(f.done() for f in slow)
    for gate in gates:
        gate.set()
    assert [f.result(TIMEOUT) for f in slow] == ["SLOW0", "SLOW1", "SLOW2"]


def test_a_queued_compile_withdrawn_never_runs() -> None:
    work = Gated()
    gate = work.gate("slow")
    pool: CompilePool[str, str] = CompilePool(work, workers=1)
    slow = pool.submit("slow")
    queued = pool.submit("queued")
    assert queued.cancel()
    assert pool.stats()["queued"] == 0
    gate.set()
    assert slow.result(TIMEOUT) == "SLOW"
    time.sleep(0.05)
    assert work.ran == ["slow"]


def test_a_running_compile_withdrawn_frees_its_place_for_the_next() -> None:
    work = Gated()
    gate = work.gate("hostile")
    pool: CompilePool[str, str] = CompilePool(work, workers=1)
    hostile = pool.submit("hostile")
    assert work.started["hostile"].wait(TIMEOUT)
    waiting = pool.submit("normal")
    time.sleep(0.05)
    assert not waiting.done()  # one worker, and someone still waits for the hostile compile
    hostile.cancel()  # its client left, or its budget ran out
    assert waiting.result(TIMEOUT) == "NORMAL"  # while the hostile compile still runs
    idle = {"queued": 0, "busy": 0, "abandoned": 0}
    assert settled(pool, {**idle, "abandoned": 1}) == {**idle, "abandoned": 1}
    gate.set()
    assert settled(pool, idle) == idle


def test_abandoned_threads_are_bounded_too() -> None:
    work = Gated()
    gates = [work.gate(f"hostile{i}") for i in range(3)]
    pool: CompilePool[str, str] = CompilePool(work, workers=1, max_abandoned=1)
    first = pool.submit("hostile0")
    assert work.started["hostile0"].wait(TIMEOUT)
    first.cancel()
    second = pool.submit("hostile1")
    assert work.started["hostile1"].wait(TIMEOUT)
    second.cancel()  # past max_abandoned: its thread keeps its place
    third = pool.submit("hostile2")
    time.sleep(0.05)
    assert "hostile2" not in work.ran
    assert pool.stats() == {"queued": 1, "busy": 1, "abandoned": 1}
    for gate in gates:
        gate.set()
    assert third.result(TIMEOUT) == "HOSTILE2"


def test_callers_of_one_key_share_its_compile_and_its_error() -> None:
    work = Gated()
    gate = work.gate("bad")
    pool: CompilePool[str, str] = CompilePool(work, workers=2)
    a, b = pool.submit("bad"), pool.submit("bad")
    a.cancel()  # the other caller still waits: the compile goes on for it
    gate.set()
    with pytest.raises(ValueError, match="cannot compile bad"):
        b.result(TIMEOUT)
    assert work.ran == ["bad"]


def test_many_callers_at_once() -> None:
    pool: CompilePool[int, int] = CompilePool(lambda k: k * 2, workers=3)
    futures = [pool.submit(i % 7) for i in range(200)]
    assert [f.result(TIMEOUT) for f in concurrent.futures.as_completed(futures)]
    assert sorted(f.result() for f in futures) == sorted(2 * (i % 7) for i in range(200))
    assert pool.stats()["busy"] <= 3


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        CompilePool(str, workers=0)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="needs per-thread nice values (Linux)")
def test_pool_threads_run_at_a_lower_priority_than_their_caller() -> None:
    def own_nice(_: str) -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    caller = own_nice("")
    pool: CompilePool[str, int] = CompilePool(own_nice, workers=1, niceness=5)
    assert pool.submit("x").result(TIMEOUT) == min(caller + 5, 19)
    assert own_nice("") == caller  # the caller's own priority is left alone
