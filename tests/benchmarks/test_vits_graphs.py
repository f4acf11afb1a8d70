"""The VITS graphs benchmark end to end on the CPU (both variants eager there), on a tiny random VITS."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_every_batch_is_timed_for_both_variants_idle_and_busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import vits_graphs

    out = tmp_path / "vits_graphs.jsonl"
    monkeypatch.setattr(vits_graphs, "BATCHES", ((1, 2), (3, 4)))
    monkeypatch.setattr(sys, "argv", ["vits_graphs", "--device", "cpu", "--tiny", "--reps", "2", "--out", str(out)])
    vits_graphs.main()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "run" and lines[0]["tts"] == "random, tiny shape"
    assert [line["max_difference"] for line in lines if line["kind"] == "check"] == [0.0]  # same seed, same audio
    rows = [line for line in lines if line["kind"] == "batch_result"]
    assert [(r["load"], r["rows"]) for r in rows] == [
        ("idle", 1),
        ("idle", 3),
        ("busy neighbour", 1),
        ("busy neighbour", 3),
    ]
    for r in rows:
        for key in ("eager_pass_ms", "graphs_pass_ms", "eager_first_window_ms", "graphs_first_window_ms"):
            assert r[key] > 0
        assert r["eager_first_window_ms"] >= r["eager_pass_ms"] and r["graphs_first_window_ms"] >= r["graphs_pass_ms"]
