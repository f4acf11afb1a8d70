"""The voice-sessions benchmark's bookkeeping: which turns count as lost or heard right, and its stages."""

from __future__ import annotations

import base64
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.voice_sessions import (
    RATE,
    batch_sizes,
    content_words,
    play,
    record,
    report,
    run_settings,
    spoken_questions,
    turn_row,
)


def test_a_transcript_is_right_when_it_holds_the_questions_content_words_digits_read_as_words() -> None:
    assert content_words("What is two plus two?") == content_words("what is 2 plus 2") == {"two", "plus"}
    assert not content_words("Which animal says moo?") <= content_words("which animal says mood?")


def test_turn_rows_split_the_latency_into_stages_and_count_lost_turns() -> None:
    turn = {"question": "What is two plus two?", "transcript": " what is 2 plus 2", "answer": "Four."}
    assert turn_row(dict(turn))["lost"] and turn_row(dict(turn))["seen"] == []  # no speech_stopped seen
    unanswered = turn_row(dict(turn, stopped=10.0, transcribed=10.3))
    assert unanswered["lost"] and unanswered["seen"] == ["stopped", "transcribed"]
    row = turn_row(dict(turn, stopped=10.0, transcribed=10.3, created=10.2, first_audio=10.9, early_deltas=2))
    assert not row["lost"] and row["transcript_right"] and row["answer"] == "Four." and row["early_deltas"] == 2
    assert row["total"] == pytest.approx(0.9) and row["asr"] == pytest.approx(0.3)
    assert row["start"] == 0 and row["reply"] == pytest.approx(0.6)
    summary = report(1, [row, turn_row(dict(turn))])
    assert summary["lost"] == 1 and summary["turns_with_early_deltas"] == 1 and summary["p50_s"] == row["total"]


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


def test_a_listener_hears_silence_only_when_the_next_delta_is_late() -> None:
    assert play(10.0, 9.5, 0.1) == (0.0, 10.1)  # came while the audio before it still played
    stall, until = play(10.0, 10.25, 0.1)
    assert stall == pytest.approx(0.25) and until == pytest.approx(10.35)


def audio(seconds: float, response_id: str) -> dict:
    pcm = bytes(int(seconds * RATE) * 2)
    return {"type": "response.output_audio.delta", "response_id": response_id, "delta": base64.b64encode(pcm).decode()}


def test_a_turn_counts_its_own_response_only_and_sums_the_stalls_inside_it() -> None:
    turn = {"question": "What do bees make?", "transcript": "", "answer": ""}
    earlier = "resp_earlier"  # the previous turn's reply, still streaming when this turn began
    assert not record(turn, audio(0.5, earlier), 1.0)
    assert not record(turn, {"type": "response.done", "response": {"id": earlier}}, 1.1)
    assert not record(turn, {"type": "response.created", "response": {"id": earlier}}, 1.2)  # before speech_stopped
    assert "first_audio" not in turn and "response_id" not in turn
    record(turn, {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2000}, 2.0)
    record(turn, {"type": "conversation.item.input_audio_transcription.completed", "transcript": "bees"}, 2.2)
    record(turn, {"type": "response.created", "response": {"id": "resp_1"}}, 2.3)
    record(turn, {"type": "response.output_audio_transcript.delta", "response_id": "resp_1", "delta": "Honey."}, 2.5)
    record(turn, audio(0.2, "resp_1"), 2.5)  # plays until 2.7
    record(turn, audio(0.2, "resp_1"), 2.6)  # in time: until 2.9
    record(turn, audio(0.2, "resp_1"), 3.2)  # 0.3 s of silence before it
    assert not record(turn, audio(1.0, earlier), 3.3)
    assert record(turn, {"type": "response.done", "response": {"id": "resp_1"}}, 3.4)
    row = turn_row(turn)
    assert not row["lost"] and row["answer"] == "Honey." and row["total"] == pytest.approx(0.5)
    assert row["stall"] == pytest.approx(0.3)
    summary = report(1, [row])
    assert summary["stall_p50_s"] == pytest.approx(0.3) and summary["turns_stalled"] == 1


def test_first_turns_and_later_ones_are_summarized_apart() -> None:
    turn = {"question": "What do bees make?", "transcript": "What do bees make?", "answer": ""}
    rows = [
        dict(turn_row(dict(turn, stopped=10.0, first_audio=10.0 + total)), session=session, turn=index)
        for session, index, total in ((0, 0, 0.8), (1, 0, 0.6), (0, 1, 0.1), (1, 1, 0.3), (1, 2, 0.2))
    ]
    summary = report(2, rows)
    assert summary["first_turns_p50_s"] == pytest.approx(0.7)
    assert summary["later_turns_p50_s"] == pytest.approx(0.2)
    assert summary["p50_s"] == pytest.approx(0.3)


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
