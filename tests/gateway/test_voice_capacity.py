"""Admission by the measured playback of spoken replies, on a fake clock."""

from __future__ import annotations

import pytest
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity, check_rtf_limit
from omni_gateway.gateway.realtime.voice_timing import Playback


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reply(rtf: float, underruns: int = 0) -> Playback:
    return Playback(audio_s=2.0, stream_s=2.0 * rtf, underruns=underruns, longest_gap_s=0.1 if underruns else 0.0)


def tracker(clock: Clock, limit: float = 0.9, replies: int = 32, max_age_s: float = 30.0) -> VoiceCapacity:
    return VoiceCapacity(limit, clock=clock, replies=replies, max_age_s=max_age_s, min_replies=8)


def test_too_few_replies_admit_however_slow_they_were() -> None:
    capacity = tracker(Clock())
    for _ in range(7):
        capacity.playback(reply(3.0, underruns=5))
    admitted, reason = capacity.admits()
    assert admitted and "7 spoken replies" in reason and "8" in reason


def test_a_p90_at_the_limit_refuses_and_says_what_was_measured() -> None:
    capacity = tracker(Clock())
    for rtf in [0.2] * 17 + [0.97, 0.97, 1.4]:  # 20 replies: the 18th of them sorted is the p90
        capacity.playback(reply(rtf))
    admitted, reason = capacity.admits()
    assert not admitted
    assert reason == (
        "spoken replies are falling behind real time: p90 real-time factor 0.97 over the last 20 replies (limit 0.9)"
    )
    assert capacity.rtf_p90() == pytest.approx(0.97)


def test_a_p90_below_the_limit_admits() -> None:
    capacity = tracker(Clock())
    for rtf in [0.2] * 18 + [1.4, 1.4]:  # the two slowest are the top 10 %: p90 is the 18th, 0.2
        capacity.playback(reply(rtf))
    admitted, reason = capacity.admits()
    assert admitted and reason == "p90 real-time factor 0.20 over the last 20 replies (limit 0.9)"
    capacity.playback(reply(0.95))  # 21 replies: the p90 is now the 19th sorted
    assert capacity.admits()[0] is False


def test_underruns_beyond_the_allowance_refuse_however_fast_the_replies() -> None:
    capacity = tracker(Clock())
    for i in range(16):
        capacity.playback(reply(0.3, underruns=2 if i < 4 else 0))  # 4 of 16 ran dry: a quarter is allowed
    assert capacity.admits()[0] is True
    capacity.playback(reply(0.3, underruns=1))
    admitted, reason = capacity.admits()
    assert not admitted
    assert reason == (
        "spoken replies are running dry: 5 of the last 17 replies ran out of audio mid-playback (allowance 4)"
    )


def test_the_window_keeps_the_latest_replies_only() -> None:
    capacity = tracker(Clock(), replies=8)
    for _ in range(8):
        capacity.playback(reply(1.2))
    assert capacity.admits()[0] is False
    for _ in range(7):
        capacity.playback(reply(0.1))
    assert capacity.admits()[0] is False  # one slow reply left of eight: it is the p90
    capacity.playback(reply(0.1))
    assert capacity.admits() == (True, "p90 real-time factor 0.10 over the last 8 replies (limit 0.9)")


def test_admission_reopens_as_the_window_ages() -> None:
    clock = Clock()
    capacity = tracker(clock, max_age_s=30.0)
    for _ in range(8):
        capacity.playback(reply(1.2))
    clock.now += 20
    for _ in range(8):
        capacity.playback(reply(0.2))
    assert capacity.admits()[0] is False  # 16 replies, 8 of them slow
    clock.now += 10.5  # the slow ones are past 30 s old
    assert capacity.admits() == (True, "p90 real-time factor 0.20 over the last 8 replies (limit 0.9)")
    clock.now += 30
    admitted, reason = capacity.admits()
    assert admitted and "0 spoken replies" in reason and capacity.rtf_p90() is None


def test_replies_without_audio_are_not_counted() -> None:
    capacity = tracker(Clock())
    for _ in range(10):
        capacity.playback(Playback(audio_s=0.0, stream_s=0.0, underruns=0, longest_gap_s=0.0))
    assert capacity.rtf_p90() is None and capacity.admits()[0] is True


def test_a_limit_of_zero_turns_it_off() -> None:
    capacity = tracker(Clock(), limit=0)
    for _ in range(32):
        capacity.playback(reply(5.0, underruns=9))
    assert capacity.admits() == (True, "admission by real-time factor is off")
    assert capacity.rtf_p90() == pytest.approx(5.0)  # still measured


@pytest.mark.parametrize("value", [-0.1, 1.51, float("nan"), float("inf"), "0.9", True, None])
def test_bad_limits_are_refused_with_the_accepted_range(value: object) -> None:
    with pytest.raises(ValueError, match=r"from 0 \(off\) to 1.5, got"):
        check_rtf_limit(value)
    assert check_rtf_limit(1.5) == 1.5 and check_rtf_limit(0) == 0.0


def test_the_config_field_is_checked_by_name() -> None:
    from omni_gateway.gateway.config import GatewayConfig

    assert GatewayConfig(voice_admission_rtf=0).voice_admission_rtf == 0  # off, not a bound that must be > 0
    with pytest.raises(ValueError, match=r"voice_admission_rtf must be a number from 0 \(off\) to 1.5, got 2"):
        GatewayConfig(voice_admission_rtf=2)
