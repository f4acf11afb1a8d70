"""The interpreter-lock benchmark: a call timed alone and beside a busy thread, the switch interval restored."""

from __future__ import annotations

import sys
import time

from benchmarks.gil_convoy import measure


def test_a_call_is_timed_alone_and_beside_a_thread_that_kept_working() -> None:
    calls = []

    def render() -> None:  # lets go of the lock, as a torch operator does, so the busy thread runs
        calls.append(1)
        time.sleep(0.003)

    default = sys.getswitchinterval()
    row = measure(render, interval_s=0.001, calls=5)
    assert len(calls) == 10  # five alone, five beside the busy thread
    assert row["alone_ms"] > 0 and row["beside_ms"] > 0
    assert row["slowdown"] == row["beside_ms"] / row["alone_ms"]
    assert row["busy_events_per_s"] > 0
    assert sys.getswitchinterval() == default
