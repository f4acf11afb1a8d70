"""The TTS schedule benchmark: its stand-in's windows, and a small run of both designs end to end."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from benchmarks import tts_schedule
from benchmarks.tts_schedule import FRAME_SAMPLES, TimedVits, reply


@pytest.mark.parametrize("streaming", [True, False])
def test_the_stand_in_hands_out_its_audio_as_the_design_does(streaming: bool) -> None:
    vits = TimedVits(0.0, 0.0, streaming)
    render = vits.start_batch(["a" * 100, "b" * 10])  # 450 and 45 frames, windows of 512 frames for two rows
    render.window = 64  # several steps
    got: list[list[int]] = [[], []]
    complete_at = [0, 0]
    steps, done = 0, False
    while not done:
        done = render.step()
        steps += 1
        for row, (samples, complete) in enumerate(render.take()):
            got[row].append(len(samples))
            if complete and not complete_at[row]:
                complete_at[row] = steps
    assert [sum(g) for g in got] == [450 * FRAME_SAMPLES, 45 * FRAME_SAMPLES] and steps == 8
    if streaming:
        assert got[0][:2] == [64 * FRAME_SAMPLES] * 2 and complete_at == [8, 1]
    else:
        assert got[0][:-1] == [0] * 7 and complete_at == [8, 8]


def test_replies_are_the_words_asked_for_and_run_on_ones_lack_punctuation() -> None:
    text = reply(48, random.Random(1), run_on=False)
    assert len(text.split()) == 48 and any(c in text for c in ",.;")
    run_on = reply(48, random.Random(1), run_on=True)
    assert len(run_on.split()) == 48 and run_on.replace(" ", "").isalnum() and run_on == run_on.lower()


def test_both_designs_run_and_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "tts_schedule.jsonl"
    argv = ["tts_schedule", "--streams", "3", "--words", "12", "--tokens-per-s", "200", "--spread-s", "0.05"]
    argv += ["--pass-ms", "2", "--step-ms", "2", "--seeds", "2", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    tts_schedule.main()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "run" and lines[0]["words"] == 12
    runs = [line for line in lines[1:] if line["kind"] == "run"]
    assert [(r["design"], r["seed"]) for r in runs] == [(d, seed) for d in ("previous", "current") for seed in (0, 1)]
    for row in runs:
        assert 0 < row["first_p50_ms"] <= row["first_p90_ms"] < 5000  # every reply was heard
        assert 0 < row["busy"] <= 1 and row["batch_p50"] >= 1
    medians = [line for line in lines if line["kind"] == "median"]
    assert [m["design"] for m in medians] == ["previous", "current"]
    for m in medians:
        mine = [r for r in runs if r["design"] == m["design"]]
        assert m["stall_p90_ms"] == round(sum(r["stall_p90_ms"] for r in mine) / 2, 2)  # the median of two
        assert m["replies_stalled_each"] == [r["replies_stalled"] for r in mine]
    assert [line["streams"] for line in lines if line["kind"] == "ratio"] == [3]
