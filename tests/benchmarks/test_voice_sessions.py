"""The voice-sessions benchmark's bookkeeping: its summary per N, the batching stages' figures, its header."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.lib.voice_client import content_words, turn_row
from benchmarks.voice_sessions import batch_sizes, report, run_settings, spoken_questions


def test_a_transcript_is_right_when_it_holds_the_questions_content_words_digits_read_as_words() -> None:
    assert content_words("What is two plus two?") == content_words("what is 2 plus 2") == {"two", "plus"}
    assert not content_words("Which animal says moo?") <= content_words("which animal says mood?")


def answered(wait: float, **fields: object) -> dict:
    """A turn whose speech ended at 10.0 and whose first audio came ``wait`` later."""
    turn = {"question": "What is two plus two?", "transcript": " what is 2 plus 2", "answer": "Four.", "speech_s": 1.0}
    return dict(
        turn, speech_end_sent=10.0, stopped=10.5, first_audio=10.0 + wait, arrivals=[(10 + wait, 1.0)], **fields
    )


def test_batch_sizes_and_busy_shares_of_the_batching_stages_are_read_and_reset() -> None:
    asr = SimpleNamespace(
        batch_sizes=deque([1, 3]),
        batch_seconds=deque([0.5, 1.0, 0.25]),
        busy_s=1.5,
        wait_seconds=deque([0.0, 0.002, 0.004, 0.1]),
        job_seconds=deque([0.2, 0.3]),
    )
    tts = SimpleNamespace(
        batch_sizes=deque([2]),
        busy_s=0.0,
        pass_seconds=deque([0.02, 0.03, 0.5]),
        first_clause_seconds=deque([0.25]),
        first_wait_seconds=deque([0.01, 0.03]),
    )
    backend = SimpleNamespace(
        asr=asr,
        tts=SimpleNamespace(synthesizer=tts, first_segment_seconds=deque([0.125]), first_text_seconds=deque([0.05])),
    )
    assert batch_sizes(backend, 3.0) == {
        "asr_mean_batch": 2.0,
        "asr_batch_p50_ms": 500.0,
        "asr_batch_p90_ms": 1000.0,
        "asr_requests": 2,
        "asr_wait_p50_ms": 4.0,
        "asr_wait_p90_ms": 100.0,
        "asr_job_p50_ms": 200.0,
        "asr_job_p90_ms": 300.0,
        "asr_busy": 0.5,
        "tts_mean_batch": 2.0,
        "tts_pass_p50_ms": 30.0,
        "tts_first_clause_p50_ms": 250.0,
        "tts_first_clause_p90_ms": 250.0,
        "tts_first_wait_p50_ms": 10.0,
        "tts_first_wait_p90_ms": 30.0,
        "reply_first_segment_p50_ms": 125.0,
        "reply_first_segment_p90_ms": 125.0,
        "reply_first_text_p50_ms": 50.0,
        "reply_first_text_p90_ms": 50.0,
    }
    assert batch_sizes(backend, 3.0) == {} and batch_sizes(SimpleNamespace(), 1.0) == {}


def test_the_summary_counts_lost_turns_and_partial_transcripts_and_prints_the_latency_from_the_end_of_speech(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lost = turn_row({"question": "What do bees make?", "transcript": "", "answer": "", "arrivals": []})
    row = turn_row(answered(0.9, early_deltas=2))
    summary = report("server_vad N=1", [row, lost])
    assert summary["lost"] == 1 and summary["turns_with_early_deltas"] == 1 and summary["transcripts_right"] == 1
    assert summary["latency_p50_s"] == pytest.approx(0.9) and summary["decision_p50_s"] == pytest.approx(0.5)
    assert "server_vad N=1: 2 turns, 1 lost" in capsys.readouterr().out


def test_spoken_questions_are_read_back_from_the_file_a_piper_host_saved(tmp_path: Path) -> None:
    pcm = {"What do bees make?": np.arange(-5, 5, dtype="<i2"), "Name a fruit.": np.array([7, -7], "<i2")}
    np.savez(tmp_path / "spoken.npz", **pcm)
    assert spoken_questions(str(tmp_path / "spoken.npz")) == {q: a.tobytes() for q, a in pcm.items()}


def test_first_turns_and_later_ones_are_summarized_apart() -> None:
    rows = [
        dict(turn_row(answered(wait)), session=session, turn=index)
        for session, index, wait in ((0, 0, 0.8), (1, 0, 0.6), (2, 0, 0.7), (0, 1, 0.1), (1, 1, 0.3), (1, 2, 0.2))
    ]
    summary = report("N=3", rows)
    assert summary["first_turns_p50_s"] == pytest.approx(0.7)
    assert summary["later_turns_p50_s"] == pytest.approx(0.2)
    assert summary["latency_p50_s"] == pytest.approx(0.3)


def test_a_runs_header_records_the_asr_batch_cap_of_a_batching_recognizer_and_none_for_the_fake_backend() -> None:
    from tests.harness.fake_backend import FakeBackend

    args = SimpleNamespace(
        model="m",
        asr="a",
        tts="t",
        random_stages=None,
        tiny_stages=False,
        partial_transcripts_ms=0,
        engine_in_process=False,
        asr_batches_alone=True,
        stagger_s=0.0,
        gpu_memory_utilization=None,
    )
    batching = SimpleNamespace(asr=SimpleNamespace(max_batch=8))
    assert run_settings(args, batching)["asr_max_batch"] == 8  # type: ignore[arg-type]
    assert run_settings(args, FakeBackend())["asr_max_batch"] is None  # type: ignore[arg-type]
