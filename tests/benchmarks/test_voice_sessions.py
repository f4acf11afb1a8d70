"""The voice-sessions benchmark's bookkeeping: which turns count as lost or heard right, and its stages."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from benchmarks.voice_sessions import batch_sizes, content_words, report, turn_row


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


def test_batch_sizes_of_the_batching_stages_are_read_and_reset() -> None:
    asr = SimpleNamespace(batch_sizes=deque([1, 3]))
    backend = SimpleNamespace(asr=asr, tts=SimpleNamespace(synthesizer=SimpleNamespace(batch_sizes=deque([2]))))
    assert batch_sizes(backend) == {"asr_mean_batch": 2.0, "tts_mean_batch": 2.0}
    assert batch_sizes(backend) == {} and batch_sizes(SimpleNamespace()) == {}
