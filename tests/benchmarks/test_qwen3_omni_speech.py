"""The Qwen3-Omni speech benchmark: its player model counts underruns as a listener hears them, and a tiny
checkpoint runs the whole path (transformers' baseline, then ours from dummy weights) on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.qwen3_omni_speech import main, playback


def test_chunks_that_keep_ahead_of_the_player_never_underrun() -> None:
    # 100 ms chunks, the first at 0.5 s, then one every 80 ms: always ahead of playback.
    arrivals = [(0.5 + 0.08 * i, 0.1) for i in range(10)]
    assert playback(arrivals) == {"underruns": 0, "stall_s": 0.0, "gap_s": pytest.approx(0.08)}


def test_a_late_chunk_is_one_underrun_and_playback_resumes_from_it() -> None:
    # 0.2 s of audio from t=1.0 runs out at 1.2; the next comes at 1.5 (a 0.3 s stall), then plays to 1.6; the
    # one at 1.55 is in time.
    arrivals = [(1.0, 0.2), (1.5, 0.1), (1.55, 0.1)]
    got = playback(arrivals)
    assert got["underruns"] == 1
    assert got["stall_s"] == pytest.approx(0.3) and got["gap_s"] == pytest.approx(0.5)
    assert playback([]) == {"underruns": 0, "stall_s": 0.0, "gap_s": 0.0}


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_the_tiny_model_runs_the_baseline_and_ours_at_each_concurrency(tmp_path: Path) -> None:
    out = tmp_path / "q3.jsonl"
    argv = ["--model", "tiny-qwen3-omni", "--device", "cpu", "--concurrency", "1", "2"]
    main([*argv, "--frames", "12", "--text-tokens", "4", "--prompt-words", "8", "--out", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    results = [r for r in records if r.get("kind") == "result"]
    assert [(r["system"], r["concurrency"]) for r in results] == [
        ("transformers", 1),
        ("omni-gateway", 1),
        ("omni-gateway", 2),
    ]
    for r in results[1:]:
        assert r["first_audio"]["n"] == r["concurrency"] and r["audio_s_mean"] > 0
        assert r["underruns"] >= 0 and r["gap_s_max"] >= r["stall_s_max"] >= 0
    assert results[0]["audio_s"] > 0 and results[0]["rtf"] > 0
