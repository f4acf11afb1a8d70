"""The listening benchmark end to end on two sessions: it reports the server's own CPU and loop lag."""

from __future__ import annotations

import pytest

from benchmarks.voice_ingest import measure

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("vad", ["inline", "batched"])
def test_two_sessions_streamed_for_two_seconds_are_measured(vad: str) -> None:
    row = measure(2, 2.0, None, vad)
    assert row["sessions"] == 2 and row["vad"] == vad
    assert row["audio_s"] == pytest.approx(4.0)  # every chunk of both streams was sent
    assert 0 < row["server_cpu_s"] and row["window_s"] == pytest.approx(2.0, abs=0.5)
    assert 0 <= row["loop_lag_p50_ms"] <= row["loop_lag_p99_ms"] <= row["loop_lag_max_ms"]
    assert (row["mean_vad_batch"] is None) == (vad == "inline")
