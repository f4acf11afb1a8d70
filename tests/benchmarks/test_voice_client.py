"""The voice benchmarks' client: where its own speech ends, how a reply plays, a turn's row and the summary."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from benchmarks.lib.voice_client import (
    RATE,
    STAGES,
    compare,
    play,
    quantiles,
    record,
    session,
    session_update,
    speech_end,
    summarize,
    table,
    turn_row,
)


def tone(seconds: float, amplitude: float = 0.5, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * 32767 * np.sin(2 * np.pi * freq * t)).astype("<i2")


def test_speech_ends_at_the_tones_last_sample_not_in_the_silence_after_it() -> None:
    pcm = np.concatenate([np.zeros(RATE // 4, "<i2"), tone(0.7), np.zeros(RATE // 2, "<i2")])
    end = speech_end(pcm.tobytes())
    assert end == pytest.approx(RATE // 4 + int(0.7 * RATE), abs=RATE // 1000)  # within 1 ms
    assert speech_end(pcm) == end  # samples or bytes alike


def test_a_tail_below_the_floor_is_silence_and_one_above_it_is_speech() -> None:
    rng = np.random.default_rng(0)
    loud = tone(0.5)
    faint = (rng.standard_normal(RATE // 2) * 16384 * 10 ** (-60 / 20)).astype("<i2")  # -60 dB of the tone
    quiet = tone(0.3, amplitude=0.5 * 10 ** (-30 / 20))  # -30 dB: a soft ending is still speech
    assert speech_end(np.concatenate([loud, faint])) == pytest.approx(len(loud), abs=RATE // 1000)
    assert speech_end(np.concatenate([loud, quiet, faint])) == pytest.approx(len(loud) + len(quiet), abs=RATE // 1000)


def test_silence_has_no_speech() -> None:
    assert speech_end(np.zeros(RATE, "<i2")) == 0 and speech_end(b"") == 0


def test_playback_counts_each_dry_buffer_its_longest_gap_and_the_delivery_rate() -> None:
    # 0.2 s deltas: the second in time, the third 0.3 s after the buffer ran dry at 10.4, the fourth 0.1 s late
    heard = play([(10.0, 0.2), (10.1, 0.2), (10.7, 0.2), (11.0, 0.2)])
    assert heard.underruns == 2 and heard.longest_gap_s == pytest.approx(0.3)
    assert heard.stall_s == pytest.approx(0.4) and heard.audio_s == pytest.approx(0.8)
    assert heard.rtf == pytest.approx(1.0 / 0.8)


def test_a_reply_delivered_faster_than_it_plays_never_runs_dry() -> None:
    heard = play([(5.0, 1.0), (5.1, 1.0), (5.2, 0.0), (5.3, 1.0)])  # an empty delta is no audio
    assert heard.underruns == 0 and heard.longest_gap_s == 0 and heard.rtf == pytest.approx(0.1)
    assert play([]).rtf is None and play([(1.0, 0.0)]).underruns == 0


def test_quantiles_are_nearest_rank_p50_p90_p99() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, unordered
    assert quantiles(values, "x") == {"x_p50_s": 51.0, "x_p90_s": 90.0, "x_p99_s": 99.0}
    assert quantiles([0.3], "y") == {"y_p50_s": 0.3, "y_p90_s": 0.3, "y_p99_s": 0.3}


def test_the_session_names_its_turn_detector_and_refuses_an_unknown_one() -> None:
    assert session_update("semantic_vad")["session"]["audio"]["input"]["turn_detection"] == {"type": "semantic_vad"}
    server = session_update("server_vad")["session"]["audio"]["input"]["turn_detection"]
    assert server == {"type": "server_vad", "silence_duration_ms": 500}
    with pytest.raises(ValueError, match="semantic_vad"):
        session_update("push_to_talk")


def audio(seconds: float, response_id: str) -> dict:
    pcm = bytes(int(seconds * RATE) * 2)
    return {"type": "response.output_audio.delta", "response_id": response_id, "delta": base64.b64encode(pcm).decode()}


def new_turn(question: str = "What do bees make?") -> dict:
    return {"question": question, "transcript": "", "answer": "", "arrivals": [], "speech_end_sent": 1.5, "speech_s": 1}


def test_a_turn_counts_its_own_response_and_splits_the_wait_from_the_end_of_speech() -> None:
    turn = new_turn()
    earlier = "resp_earlier"  # the previous turn's reply, still streaming when this turn began
    assert not record(turn, audio(0.5, earlier), 1.0)
    assert not record(turn, {"type": "response.done", "response": {"id": earlier}}, 1.1)
    assert not record(turn, {"type": "response.created", "response": {"id": earlier}}, 1.2)  # before speech_stopped
    assert "first_audio" not in turn and "response_id" not in turn
    record(turn, {"type": "conversation.item.input_audio_transcription.delta", "delta": "bee"}, 1.4)
    record(turn, {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2000}, 2.0)
    record(turn, {"type": "conversation.item.input_audio_transcription.completed", "transcript": "bees make"}, 2.2)
    record(turn, {"type": "response.created", "response": {"id": "resp_1"}}, 2.3)
    record(turn, {"type": "response.output_text.delta", "response_id": "resp_1", "delta": "Honey."}, 2.45)
    record(turn, audio(0.2, "resp_1"), 2.5)  # plays until 2.7
    record(turn, audio(0.2, "resp_1"), 2.6)  # in time: until 2.9
    record(turn, audio(0.2, "resp_1"), 3.2)  # 0.3 s of silence before it
    assert not record(turn, audio(1.0, earlier), 3.3)
    assert record(turn, {"type": "response.done", "response": {"id": "resp_1"}}, 3.4)
    row = turn_row(turn)
    assert not row["lost"] and row["answer"] == "Honey." and row["transcript_right"] and row["early_deltas"] == 1
    assert row["latency_s"] == pytest.approx(1.0) and row["stopped_to_audio_s"] == pytest.approx(0.5)
    split = [row[f"{stage}_s"] for stage in STAGES]
    assert split == pytest.approx([0.5, 0.2, 0.1, 0.15, 0.05])
    assert row["underruns"] == 1 and row["longest_gap_s"] == pytest.approx(0.3)
    assert row["rtf"] == pytest.approx(0.7 / 0.6) and row["reply_audio_s"] == pytest.approx(0.6)


def test_stages_whose_events_came_after_the_first_audio_count_nothing_so_the_split_adds_up() -> None:
    # the reply's text deltas after its audio; the transcript after both
    turn = dict(new_turn(), stopped=2.0, created=2.1, first_audio=2.3, transcribed=2.6, first_token=2.4)
    turn["arrivals"] = [(2.3, 0.5)]
    row = turn_row(turn)
    assert [row[f"{stage}_s"] for stage in STAGES] == pytest.approx([0.5, 0.3, 0.0, 0.0, 0.0])
    assert sum(row[f"{stage}_s"] for stage in STAGES) == pytest.approx(row["latency_s"])


def test_a_lost_turn_says_how_far_it_got_and_the_summary_leaves_it_out_of_the_latency() -> None:
    lost = turn_row(dict(new_turn(), stopped=2.0, transcribed=2.1))
    assert lost["lost"] and lost["seen"] == ["stopped", "transcribed"] and "latency_s" not in lost
    kept = [
        turn_row(dict(new_turn(), stopped=2.0, first_audio=1.5 + wait, arrivals=[(1.5 + wait, 1.0)]))
        for wait in (0.6, 0.8, 1.2)
    ]
    summary = summarize([*kept, lost])
    assert summary["turns"] == 4 and summary["lost"] == 1
    assert summary["latency_p50_s"] == pytest.approx(0.8) and summary["latency_p99_s"] == pytest.approx(1.2)
    assert summary["latency_mean_s"] == pytest.approx(sum(summary[f"{s}_mean_s"] for s in STAGES))
    assert summary["underruns"] == 0 and summary["rtf_p50"] == 0.0
    assert "p50 800 ms, p90 1200 ms, p99 1200 ms" in table("N=1", summary)
    assert table("N=1", summarize([lost])) == "N=1: 1 turns, 1 lost, 0 transcripts right"


def test_detectors_are_compared_by_their_p50_against_the_first() -> None:
    line = compare({"server_vad": 0.8, "semantic_vad": 0.6}, "N=4: ")
    assert line == "N=4: server_vad p50 800 ms, semantic_vad p50 600 ms, semantic_vad/server_vad 0.75x"


@pytest.mark.parametrize(("mode", "pause_s"), [("server_vad", 0.5), ("semantic_vad", 0.3)])
def test_a_session_against_the_fake_server_measures_from_the_end_of_its_own_speech(mode: str, pause_s: float) -> None:
    from tests.harness.fake_backend import FakeBackend
    from tests.harness.live_server import serve

    question = "What do bees make?"
    spoken = {question: np.concatenate([tone(0.6, amplitude=0.8), np.zeros(RATE // 10, "<i2")]).tobytes()}
    with serve(FakeBackend()) as port:
        (turn,) = asyncio.run(session(f"ws://127.0.0.1:{port}/v1/realtime", [question], spoken, 10.0, mode))
    row = turn_row(turn)
    assert not row["lost"] and row["speech_s"] == pytest.approx(0.6, abs=0.001)
    # the fake detector waits out its pause after the last loud frame, as the client's clock sees it
    assert pause_s - 0.05 <= row["decision_s"] <= row["latency_s"] < pause_s + 2.0
    assert sum(row[f"{stage}_s"] for stage in STAGES) == pytest.approx(row["latency_s"])
    assert row["reply_audio_s"] > 0 and row["rtf"] is not None
