"""Checks that a speaking driver hands each chunk call its stream's playback deadline (``omni.speech_common``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True, slots=True)
class ChunkCall:
    deadline: float | None
    called_at: float  # time.monotonic() when the driver asked for the chunk
    samples: int  # the chunk's audio


def assert_playback_deadlines(calls: list[ChunkCall], rate: int, turn_began: float) -> None:
    """``calls``: one stream's chunk calls, in order. The first chunk is due at once (when it is asked for);
    each later call is due when the audio handed out before it has played, counted from the first audio: so
    consecutive calls' deadlines lie exactly the audio between them apart (chunks of one ``push`` share one)."""
    assert len(calls) >= 3, f"too short a stream to tell: {calls}"
    assert all(call.deadline is not None for call in calls), calls
    assert turn_began <= (calls[0].deadline or 0.0) <= calls[0].called_at  # the first chunk: due now
    runs: list[tuple[float, int]] = []  # (deadline, samples) of the chunks sharing it
    for call in calls:
        deadline = call.deadline or 0.0
        if runs and runs[-1][0] == deadline:
            runs[-1] = (deadline, runs[-1][1] + call.samples)
        else:
            runs.append((deadline, call.samples))
    assert len(runs) >= 3, runs
    # playback starts once the first audio is out, no sooner than it was asked for
    assert runs[1][0] >= runs[0][0] + runs[0][1] / rate - 1e-6
    for (before, samples), (due, _) in zip(runs[1:], runs[2:]):
        assert due == pytest.approx(before + samples / rate, abs=1e-6)
