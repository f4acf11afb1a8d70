"""The voice timings of a realtime session, from the observer's calls on a fake clock."""

from __future__ import annotations

import pytest
from omni_gateway.gateway.realtime.voice_timing import Playback, PlaybackClock, VoiceTiming


class Sink:
    def __init__(self) -> None:
        self.decisions: list[tuple[str, float]] = []
        self.first_audio_s: list[float] = []
        self.playbacks: list[Playback] = []

    def turn_decision(self, detection: str, seconds: float) -> None:
        self.decisions.append((detection, seconds))

    def first_audio(self, seconds: float) -> None:
        self.first_audio_s.append(seconds)

    def playback(self, playback: Playback) -> None:
        self.playbacks.append(playback)


def test_the_decision_is_the_silence_between_the_pause_and_the_stop() -> None:
    sink = Sink()
    timing = VoiceTiming(sink)
    timing.turn_committed("item_1", "semantic_vad", pause_ms=1200.0, stop_ms=1500, now=10.0)
    assert sink.decisions == [("semantic_vad", pytest.approx(0.3))]


def test_speech_end_to_first_audio_counts_the_silence_the_decision_consumed() -> None:
    sink = Sink()
    timing = VoiceTiming(sink)
    # committed at t=10 after 500 ms of silence: the speech ended at t=9.5
    timing.turn_committed("item_1", "server_vad", pause_ms=2000.0, stop_ms=2500, now=10.0)
    timing.response_created("resp_1", "item_1")
    timing.audio_delta("resp_1", 0.1, now=10.25)
    timing.audio_delta("resp_1", 0.1, now=10.3)  # only the first delta counts
    assert sink.first_audio_s == [pytest.approx(0.75)]


def test_without_a_pause_the_stop_is_the_speech_end_and_no_decision_is_timed() -> None:
    sink = Sink()
    timing = VoiceTiming(sink)
    timing.turn_committed("item_1", "server_vad", pause_ms=None, stop_ms=2500, now=10.0)
    timing.response_created("resp_1", "item_1")
    timing.audio_delta("resp_1", 0.1, now=10.4)
    assert sink.decisions == []
    assert sink.first_audio_s == [pytest.approx(0.4)]


def test_a_response_that_answers_no_turn_times_only_its_playback() -> None:
    sink = Sink()
    timing = VoiceTiming(sink)
    timing.turn_committed("item_1", "server_vad", pause_ms=0.0, stop_ms=500, now=1.0)
    timing.response_created("resp_1", "item_other")  # not the turn just committed
    timing.audio_delta("resp_1", 0.2, now=2.0)
    timing.audio_delta("resp_2", 0.2, now=2.0)  # created by the client, for no turn
    timing.response_done("resp_1")
    timing.response_done("resp_2")
    assert sink.first_audio_s == []
    assert len(sink.playbacks) == 2


def test_a_turn_is_answered_once() -> None:
    sink = Sink()
    timing = VoiceTiming(sink)
    timing.turn_committed("item_1", "server_vad", pause_ms=0.0, stop_ms=500, now=1.0)
    timing.response_created("resp_1", "item_1")
    timing.response_done("resp_1")  # cancelled before it spoke: nothing heard
    timing.response_created("resp_2", "item_1")
    timing.audio_delta("resp_2", 0.1, now=3.0)
    assert sink.first_audio_s == []
    assert sink.playbacks == []


def test_deltas_ahead_of_playback_never_underrun() -> None:
    clock = PlaybackClock(0.0, 0.2)
    for now in (0.05, 0.1, 0.3, 0.5):  # each before the audio already sent has played (0.2, 0.4, 0.6, 0.8)
        clock.delta(now, 0.2)
    result = clock.result()
    assert (result.underruns, result.longest_gap_s) == (0, 0.0)
    assert result.audio_s == pytest.approx(1.0)
    assert result.rtf == pytest.approx(0.5)


def test_a_delta_after_the_buffer_ran_dry_is_an_underrun_and_playback_resumes_from_it() -> None:
    clock = PlaybackClock(0.0, 0.1)  # plays until 0.1
    clock.delta(0.15, 0.1)  # dry for 50 ms; plays 0.15-0.25
    clock.delta(0.2, 0.1)  # in time; plays until 0.35
    clock.delta(0.6, 0.1)  # dry for 250 ms; plays until 0.7
    clock.delta(0.7, 0.1)  # exactly as the buffer ends: no gap
    result = clock.result()
    assert result.underruns == 2
    assert result.longest_gap_s == pytest.approx(0.25)
    assert result.stream_s == pytest.approx(0.7)
    assert result.rtf == pytest.approx(0.7 / 0.5)


def test_a_response_s_playback_reaches_the_sink_when_it_is_done() -> None:
    sink = Sink()
    timing = VoiceTiming(sink)
    timing.audio_delta("resp_1", 0.1, now=5.0)
    timing.audio_delta("resp_1", 0.1, now=5.3)
    assert sink.playbacks == []
    timing.response_done("resp_1")
    timing.response_done("resp_1")  # said once
    [played] = sink.playbacks
    assert (played.audio_s, played.stream_s, played.underruns, played.longest_gap_s) == (
        pytest.approx(0.2),
        pytest.approx(0.3),
        1,
        pytest.approx(0.2),
    )


def test_silent_audio_has_no_rtf() -> None:
    assert Playback(audio_s=0.0, stream_s=0.0, underruns=0, longest_gap_s=0.0).rtf is None


@pytest.mark.parametrize("size", range(7))
def test_a_delta_s_size_is_read_from_its_base64_padding_included(size: int) -> None:
    from omni_gateway.gateway.realtime.frames import Base64

    assert Base64.of(bytes(size)).decoded_size() == size


def test_wire_durations_follow_the_output_format() -> None:
    from omni_gateway.gateway.realtime.audio import wire_duration_ms

    assert wire_duration_ms(4800, "pcm16") == 100.0  # 24 kHz, two bytes a sample
    assert wire_duration_ms(800, "g711_ulaw") == wire_duration_ms(800, "g711_alaw") == 100.0  # 8 kHz, one byte
