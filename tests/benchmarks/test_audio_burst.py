"""The audio-burst benchmark: every session's reply lands at once and the server's loop is timed through it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

from benchmarks.audio_burst import one_run  # noqa: E402

RATE = 24000


@pytest.mark.parametrize("compression", [False, True])
def test_each_session_gets_its_whole_clause_and_the_loop_is_timed_through_the_burst(compression: bool) -> None:
    tone = (0.3 * np.sin(np.arange(RATE // 2) * 0.05)).astype(np.float32)  # half a second: 5 deltas of 100 ms
    row = one_run(tone, RATE, sessions=3, compression=compression)
    assert row["compression"] is compression
    assert row["audio_deltas"] == 3 * 5
    assert row["loop_us_per_delta"] > 0 and row["max_stall_ms"] >= row["p99_stall_ms"] >= 0
    assert row["probe_max_ms"] > 0


def test_deflate_shrinks_silence_to_almost_nothing_and_noise_only_by_base64s_redundancy() -> None:
    from benchmarks.audio_burst import deflated_share

    assert deflated_share(np.zeros(RATE, np.float32), RATE) < 0.05
    noise = np.random.default_rng(0).uniform(-0.9, 0.9, RATE).astype(np.float32)
    assert 0.74 < deflated_share(noise, RATE) < 0.8  # base64 of noise: only its 6 bits a character go
