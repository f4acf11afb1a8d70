"""The voice-sessions benchmark's bookkeeping: which turns count as lost or heard right, and its stages."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.voice_sessions import batch_sizes, content_words, report, spoken_questions, turn_row


def test_a_transcript_is_right_when_it_holds_the_questions_content_words_digits_read_as_words() -> None:
    assert content_words("What is two plus two?") == content_words("what is 2 plus 2") == {"two", "plus"}
    assert not content_words("Which animal says moo?") <= content_words("which animal says mood?")


def test_turn_rows_split_the_latency_into_stages_and_count_lost_turns() -> None:
    turn = {"question": "What is two plus two?", "transcript": " what is 2 plus 2", "answer": "Four."}
    assert turn_row(dict(turn))["lost"]  # no speech_stopped seen
    row = turn_row(dict(turn, stopped=10.0, transcribed=10.3, created=10.2, first_audio=10.9, early_deltas=2))
    assert not row["lost"] and row["transcript_right"] and row["answer"] == "Four." and row["early_deltas"] == 2
    assert row["total"] == pytest.approx(0.9) and row["asr"] == pytest.approx(0.3)
    assert row["start"] == 0 and row["reply"] == pytest.approx(0.6)
    summary = report(1, [row, turn_row(dict(turn))])
    assert summary["lost"] == 1 and summary["turns_with_early_deltas"] == 1 and summary["p50_s"] == row["total"]


def test_batch_sizes_and_busy_shares_of_the_batching_stages_are_read_and_reset() -> None:
    asr = SimpleNamespace(batch_sizes=deque([1, 3]), batch_seconds=deque([0.5, 1.0, 0.25]), busy_s=1.5)
    tts = SimpleNamespace(batch_sizes=deque([2]), busy_s=0.0)
    backend = SimpleNamespace(asr=asr, tts=SimpleNamespace(synthesizer=tts))
    assert batch_sizes(backend, 3.0) == {
        "asr_mean_batch": 2.0,
        "asr_batch_p50_ms": 500.0,
        "asr_batch_p90_ms": 1000.0,
        "asr_busy": 0.5,
        "tts_mean_batch": 2.0,
    }
    assert batch_sizes(backend, 3.0) == {} and batch_sizes(SimpleNamespace(), 1.0) == {}


def test_the_latency_from_the_audio_that_ended_the_turn_counts_a_late_speech_stopped() -> None:
    turn = {"question": "What do bees make?", "transcript": "What do bees make?", "answer": ""}
    row = turn_row(dict(turn, stopped=10.0, first_audio=10.5, audio_end_sent=9.8))
    assert row["total"] == pytest.approx(0.5) and row["from_audio_end"] == pytest.approx(0.7)
    summary = report(1, [row])
    assert summary["audio_end_p50_s"] == summary["audio_end_p99_s"] == row["from_audio_end"]


def test_spoken_questions_are_read_back_from_the_file_a_piper_host_saved(tmp_path: Path) -> None:
    pcm = {"What do bees make?": np.arange(-5, 5, dtype="<i2"), "Name a fruit.": np.array([7, -7], "<i2")}
    np.savez(tmp_path / "spoken.npz", **pcm)
    assert spoken_questions(str(tmp_path / "spoken.npz")) == {q: a.tobytes() for q, a in pcm.items()}
