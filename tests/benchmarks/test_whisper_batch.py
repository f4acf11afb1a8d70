"""The Whisper batch benchmark end to end on the CPU, on a tiny random Whisper, and its busy neighbours."""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import pytest

from benchmarks.lib.neighbours import busy_neighbour

pytest.importorskip("torch")


def test_every_part_is_timed_per_variant_and_a_missing_backend_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import whisper_batch

    out = tmp_path / "whisper_batch.jsonl"
    argv = ["whisper_batch", "--device", "cpu", "--tiny", "--rows", "1", "2", "--repeats", "1", "--tokens", "3"]
    argv += ["--neighbours", "none", "process", "--sdpa", "default", "efficient", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    whisper_batch.main()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "run"
    assert [line["rows"] for line in lines if line["kind"] == "first_call"] == [1, 2]
    # the CPU has no memory-efficient attention kernel and no CUDA graphs: each reported once, not timed
    unavailable = [(line["encoder"], line["sdpa"]) for line in lines if line["kind"] == "unavailable"]
    assert unavailable == [("eager", "efficient"), ("graphs", "default"), ("graphs", "efficient")]
    batches = [line for line in lines if line["kind"] == "batch"]
    assert [(b["encoder"], b["sdpa"], b["neighbour"], b["rows"]) for b in batches] == [
        ("eager", "default", "none", 1),
        ("eager", "default", "none", 2),
        ("eager", "default", "process", 1),
        ("eager", "default", "process", 2),
    ]
    for b in batches:
        assert all(b[part] > 0 for part in whisper_batch.PARTS)
        assert b["whole_ms"] == pytest.approx(sum(b[part] for part in whisper_batch.PARTS), abs=0.05)


def test_a_process_neighbour_runs_for_the_block_only() -> None:
    before = set(multiprocessing.active_children())
    with busy_neighbour("cpu", "process"):
        (neighbour,) = set(multiprocessing.active_children()) - before
        assert neighbour.is_alive()
    assert not neighbour.is_alive()


def test_an_unknown_neighbour_is_refused() -> None:
    with pytest.raises(ValueError, match="none, thread, process"), busy_neighbour("cpu", "gpu"):
        pass
